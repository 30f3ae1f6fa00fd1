"""The librdkafka security properties in aiokafka's terms (the resolver's client)."""

from __future__ import annotations

from pathlib import Path

import pytest

from duetime.core.aiokafka_auth import AiokafkaAuth, aiokafka_auth
from duetime.core.config import CommonSettings, Env
from duetime.core.errors import ConfigError


def _auth(env: dict[str, str]) -> AiokafkaAuth:
    return aiokafka_auth(CommonSettings.from_env(Env(env)).kafka_properties)


def test_nothing_set_is_plaintext_as_before() -> None:
    auth = _auth({})
    assert auth.kwargs() == {"security_protocol": "PLAINTEXT"} and auth.ssl_context() is None


def test_sasl_ssl_scram() -> None:
    auth = _auth(
        {
            "DUETIME_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
            "DUETIME_KAFKA_SASL_MECHANISMS": "scram-sha-512",
            "DUETIME_KAFKA_SASL_USERNAME": "alice",
            "DUETIME_KAFKA_SASL_PASSWORD": "hunter2-secret",
            "DUETIME_KAFKA_LINGER_MS": "5",
        }
    )
    kwargs = auth.kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL" and kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_username"] == "alice"
    assert kwargs["sasl_plain_password"] == "hunter2-secret"
    assert kwargs["ssl_context"].check_hostname  # the system's CAs, hostname checked
    assert auth.ignored == ("linger.ms",)
    assert "hunter2" not in repr(auth)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"DUETIME_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "GSSAPI"),
        (
            {
                "DUETIME_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "DUETIME_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
            },
            "DUETIME_KAFKA_SASL_MECHANISM",
        ),
        (
            {"DUETIME_KAFKA_SECURITY_PROTOCOL": "SSL", "DUETIME_KAFKA_SSL_KEY_PEM": "hunter2-key"},
            "DUETIME_KAFKA_SSL_KEY_PEM",
        ),
        ({"DUETIME_KAFKA_SECURITY_PROTOCOL": "TLS"}, "DUETIME_KAFKA_SECURITY_PROTOCOL"),
    ],
)
def test_what_aiokafka_cannot_honour_is_refused_by_name(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        _auth(env)
    assert named in info.value.message and "hunter2" not in info.value.message


def test_tls_files_load_and_a_missing_one_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    auth = _auth(
        {
            "DUETIME_KAFKA_SECURITY_PROTOCOL": "SSL",
            "DUETIME_KAFKA_SSL_CA_LOCATION": str(missing),
            "DUETIME_KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": "none",
        }
    )
    assert not auth.check_hostname
    with pytest.raises(ConfigError) as info:
        auth.ssl_context()
    assert str(missing) in info.value.message
