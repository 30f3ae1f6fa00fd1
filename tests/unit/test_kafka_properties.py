"""librdkafka properties from the environment: the name mapping, the properties file, the
refusals, and that no secret value is ever shown."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core import kafka
from duetime.core.config import CommonSettings, Env
from duetime.core.errors import ConfigError
from duetime.core.kafka_properties import (
    FILE_VARIABLE,
    KafkaProperties,
    is_secret,
    parse_properties,
    property_of,
    variable_of,
)

_segment = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=8)
property_names = st.builds(
    lambda first, rest: first + "".join(sep + seg for sep, seg in rest),
    _segment,
    st.lists(st.tuples(st.sampled_from([".", "_"]), _segment), max_size=6),
)


@given(property_names)
def test_every_property_name_has_one_variable_and_back(name: str) -> None:
    variable = variable_of(name)
    assert variable.startswith("DUETIME_KAFKA_") and variable == variable.upper()
    assert property_of(variable) == name


@pytest.mark.parametrize(
    ("variable", "name"),
    [
        ("DUETIME_KAFKA_SECURITY_PROTOCOL", "security.protocol"),
        ("DUETIME_KAFKA_SSL_CA_LOCATION", "ssl.ca.location"),
        ("DUETIME_KAFKA_SASL_OAUTHBEARER_CLIENT_ID", "sasl.oauthbearer.client.id"),
        ("DUETIME_KAFKA_LOG__LEVEL", "log_level"),
        (
            "DUETIME_KAFKA_ENABLE_SSL_CERTIFICATE_VERIFICATION",
            "enable.ssl.certificate.verification",
        ),
    ],
)
def test_documented_examples(variable: str, name: str) -> None:
    assert property_of(variable) == name


@pytest.mark.parametrize(
    "variable",
    [
        "DUETIME_KAFKA__X",
        "DUETIME_KAFKA_X_",
        "DUETIME_KAFKA_A___B",
        "DUETIME_KAFKA_A__",
        "DUETIME_KAFKA_SSL-CA",
        "DUETIME_KAFKA_SSL_CA_LOCATIÖN",
    ],
)
def test_a_variable_that_names_no_property_is_refused_by_name(variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        CommonSettings.from_env(Env({variable: "x"}))
    assert info.value.details["variable"] == variable and variable in info.value.message


@given(st.text(st.characters(codec="utf-8"), max_size=30))
def test_no_variable_name_crashes_the_mapping(suffix: str) -> None:
    try:
        name = property_of("DUETIME_KAFKA_" + suffix)
    except ConfigError as exc:
        assert exc.details["variable"] == "DUETIME_KAFKA_" + suffix
    else:
        assert name and name == name.lower()


def test_no_variable_keeps_every_client_as_it_was() -> None:
    settings = CommonSettings.from_env(Env({"DUETIME_KAFKA_BOOTSTRAP": "h:1"}))
    assert not settings.kafka_properties and settings.kafka_properties.as_dict() == {}
    assert settings.bootstrap_servers == "h:1"


def test_duetime_own_kafka_variables_are_no_properties() -> None:
    env = {
        "DUETIME_KAFKA_BOOTSTRAP": "h:1",
        "DUETIME_KAFKA_PORT": "9092",
        "DUETIME_KAFKA_CONTROLLER_PORT": "9093",
        "DUETIME_KAFKA_HEAP_MB": "512",
        "DUETIME_KAFKA_LOG4J2": "/tmp/log4j2.xml",
        "DUETIME_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "DUETIME_KAFKA_SASL_USERNAME": "  ",  # blank: unset, as for every DUETIME_ variable
    }
    props = CommonSettings.from_env(Env(env)).kafka_properties
    assert props.as_dict() == {"security.protocol": "SASL_SSL"}
    assert props.source("security.protocol") == "DUETIME_KAFKA_SECURITY_PROTOCOL"


@pytest.mark.parametrize(
    ("variable", "hint"),
    [
        ("DUETIME_KAFKA_BOOTSTRAP_SERVERS", "DUETIME_KAFKA_BOOTSTRAP"),
        ("DUETIME_KAFKA_METADATA_BROKER_LIST", "DUETIME_KAFKA_BOOTSTRAP"),
        ("DUETIME_KAFKA_AUTO_COMMIT_ENABLE", "auto.commit.enable"),
        ("DUETIME_KAFKA_GROUP_ID", "group.id"),
        ("DUETIME_KAFKA_ENABLE_AUTO_COMMIT", "enable.auto.commit"),
        ("DUETIME_KAFKA_ISOLATION_LEVEL", "read_committed"),
        ("DUETIME_KAFKA_TRANSACTIONAL_ID", "transactional.id"),
        ("DUETIME_KAFKA_OAUTH__CB", "callable"),
    ],
)
def test_properties_duetime_depends_on_are_refused(variable: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        CommonSettings.from_env(Env({variable: "x"}))
    assert variable in info.value.message and hint in info.value.message


def test_a_variable_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text(
        "# a comment\n! another\nsecurity.protocol = SASL_SSL\nsasl.mechanism: PLAIN\n"
        "sasl.username alice\nssl.ca.location=/etc/ca\\\n  .pem\nlog_level=6\n"
    )
    env = {FILE_VARIABLE: str(path), "DUETIME_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512"}
    props = CommonSettings.from_env(Env(env)).kafka_properties
    assert props.as_dict() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "ssl.ca.location": "/etc/ca.pem",
        "log_level": "6",
    }
    assert props.source("sasl.mechanism") == "DUETIME_KAFKA_SASL_MECHANISM"
    assert (
        props.source("log_level") == f"{FILE_VARIABLE} ({path} line 8)"
    )  # the ca line continues on line 7


_value_chars = st.characters(codec="utf-8", blacklist_characters="\r\n")


def _escape(text: str, key: bool) -> str:
    """Java's Properties.store escaping (the inverse of what parse_properties reads)."""
    out = []
    for i, ch in enumerate(text):
        if ch == "\\" or ch in "=:#!" or (ch == " " and (key or i == 0)):
            out.append("\\" + ch)
        elif ch in "\t\f":
            out.append("\\t" if ch == "\t" else "\\f")
        else:
            out.append(ch)
    return "".join(out)


@given(
    st.lists(
        st.tuples(
            st.text(_value_chars, min_size=1, max_size=20), st.text(_value_chars, max_size=40)
        ),
        max_size=8,
    ),
    st.sampled_from(["=", ": ", " ", " = "]),
)
def test_properties_text_reads_back_what_was_written(
    entries: list[tuple[str, str]], separator: str
) -> None:
    text = "".join(f"{_escape(k, True)}{separator}{_escape(v, False)}\n" for k, v in entries)
    parsed = parse_properties(text)
    assert [(k, v) for _, k, v in parsed] == entries
    assert [line for line, _, _ in parsed] == list(range(1, len(entries) + 1))


def test_unicode_escape_and_a_broken_one() -> None:
    assert parse_properties("a=\\u0041b\\n") == [(1, "a", "Ab\n")]
    with pytest.raises(ConfigError) as info:
        parse_properties("\n\nsasl.password=\\u00zz-hunter2")
    assert "line 3" in info.value.message and "hunter2" not in info.value.message


@pytest.mark.parametrize("content", ["hunter2-alone\n", "p@ss=hunter2-x\n", "sasl.password=\n"])
def test_a_bad_file_line_names_the_line_and_never_quotes_it(tmp_path: Path, content: str) -> None:
    path = tmp_path / "p.properties"
    path.write_text("security.protocol=SSL\n" + content)
    with pytest.raises(ConfigError) as info:
        CommonSettings.from_env(Env({FILE_VARIABLE: str(path)}))
    assert "line 2" in info.value.message and "hunter2" not in info.value.message
    assert info.value.details["variable"] == FILE_VARIABLE


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.properties"
    with pytest.raises(ConfigError) as info:
        CommonSettings.from_env(Env({FILE_VARIABLE: str(missing)}))
    assert str(missing) in info.value.message and FILE_VARIABLE in info.value.message
    with pytest.raises(ConfigError, match="not UTF-8"):
        (tmp_path / "bin").write_bytes(b"a=\xff\xfe")
        CommonSettings.from_env(Env({FILE_VARIABLE: str(tmp_path / "bin")}))


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("sasl.password", True),
        ("ssl.key.password", True),
        ("ssl.keystore.password", True),
        ("ssl.key.pem", True),
        ("sasl.oauthbearer.client.secret", True),
        ("sasl.oauthbearer.config", True),
        ("sasl.oauthbearer.assertion.private.key.passphrase", True),
        ("sasl.jaas.config", True),
        ("sasl.username", False),
        ("ssl.ca.location", False),
        ("sasl.oauthbearer.token.endpoint.url", False),
        ("security.protocol", False),
    ],
)
def test_which_properties_are_secret(name: str, secret: bool) -> None:
    assert is_secret(name) is secret


@given(st.text(string.ascii_letters + string.digits + "!$%&/()=?+*~#-_.:,;", min_size=1))
def test_a_secret_never_shows_in_repr_or_redacted_views(tail: str) -> None:
    secret = "S3cr3t" + tail
    env = {
        "DUETIME_KAFKA_SASL_PASSWORD": secret,
        "DUETIME_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": secret + "-oauth",
        "DUETIME_KAFKA_SASL_USERNAME": "alice",
    }
    settings = CommonSettings.from_env(Env(env))
    props = settings.kafka_properties
    assert secret not in repr(settings) and secret not in str(props.redacted())
    assert "alice" in repr(settings)
    assert props.as_dict()["sasl.password"] == secret
    assert secret not in props.redact(f"auth failed for alice with {secret} and {secret}-oauth")


def test_librdkafka_refusals_name_the_variable_and_mask_secrets() -> None:
    base = {"DUETIME_KAFKA_BOOTSTRAP": "127.0.0.1:9", "DUETIME_KAFKA_LOG__LEVEL": "0"}
    unknown = CommonSettings.from_env(Env({**base, "DUETIME_KAFKA_NO_SUCH_THING": "x"}))
    for build in (
        lambda: kafka.producer(unknown),
        lambda: kafka.consumer(unknown, "g"),
        lambda: kafka.kip848_consumer(unknown, "g"),
        lambda: kafka.admin(unknown),
    ):
        with pytest.raises(ConfigError) as info:
            build()
        assert "DUETIME_KAFKA_NO_SUCH_THING" in info.value.message
        assert "no.such.thing" in info.value.message
    # a secret that happens to be the refused value too: masked in the error all the same
    leaky = CommonSettings.from_env(
        Env(
            {
                **base,
                "DUETIME_KAFKA_SECURITY_PROTOCOL": "hunter2-proto",
                "DUETIME_KAFKA_SASL_PASSWORD": "hunter2-proto",
            }
        )
    )
    with pytest.raises(ConfigError) as info:
        kafka.producer(leaky)
    assert "hunter2" not in info.value.message and "security.protocol" in info.value.message
    assert "DUETIME_KAFKA_SECURITY_PROTOCOL" in info.value.message


def test_operator_properties_reach_every_client_and_role_choices_win() -> None:
    settings = CommonSettings.from_env(
        Env(
            {
                "DUETIME_KAFKA_BOOTSTRAP": "127.0.0.1:9",
                "DUETIME_KAFKA_LOG__LEVEL": "0",
                "DUETIME_KAFKA_LINGER_MS": "7",
                # classic-member timing: applied to the schedulers' consumers, skipped for
                # KIP-848 members (librdkafka refuses them there)
                "DUETIME_KAFKA_SESSION_TIMEOUT_MS": "6000",
            }
        )
    )
    assert kafka._layered(settings, {"linger.ms": 2}, {})["linger.ms"] == "7"
    assert kafka._layered(settings, {"linger.ms": 2}, {"linger.ms": 1})["linger.ms"] == 1
    skipped = kafka._layered(settings, {}, {}, kafka._CLASSIC_MEMBER_ONLY)
    assert "session.timeout.ms" not in skipped and skipped["log_level"] == "0"
    clients = [
        kafka.producer(settings),
        kafka.consumer(settings, "g"),
        kafka.kip848_consumer(settings, "g"),
    ]
    for client in clients[1:]:
        client.close()  # type: ignore[attr-defined]  # consumers only
    kafka.admin(settings)


def test_kafka_properties_are_hashable_values() -> None:
    a = KafkaProperties.of([("x.y", "1", "A"), ("x.y", "2", "B")])
    assert a.as_dict() == {"x.y": "2"} and a.source("x.y") == "B"
    assert hash(a) == hash(KafkaProperties.of([("x.y", "2", "B")]))


def test_settings_repr_hides_url_passwords_too() -> None:
    env = {
        "DUETIME_DATABASE_URL": "postgresql://duetime:pg-hunter2@db:5432/duetime",
        "DUETIME_SCHEMA_REGISTRY_URL": "https://user:reg-hunter2@registry:8081",
    }
    shown = repr(CommonSettings.from_env(Env(env)))
    assert "hunter2" not in shown and "@db:5432/duetime" in shown and "registry:8081" in shown


def test_a_transactional_producer_retries_after_10_ms_unless_the_operator_says_otherwise() -> None:
    """Back-to-back transactions wait out CONCURRENT_TRANSACTIONS answers at this backoff
    (``./run bench txn``); an operator's ``retry.backoff.ms`` is kept."""
    plain = CommonSettings.from_env(Env({"DUETIME_KAFKA_BOOTSTRAP": "h:1"}))
    conf = kafka.transactional_overrides(plain, "t.0")
    assert conf["retry.backoff.ms"] == kafka.TXN_RETRY_BACKOFF_MS == 10
    assert conf["transactional.id"] == "t.0"
    env = {"DUETIME_KAFKA_BOOTSTRAP": "h:1", "DUETIME_KAFKA_RETRY_BACKOFF_MS": "250"}
    operated = CommonSettings.from_env(Env(env))
    assert "retry.backoff.ms" not in kafka.transactional_overrides(operated, "t.0")
    producer = kafka.transactional_producer(operated, "t.0")  # librdkafka takes the layering
    assert producer is not None
