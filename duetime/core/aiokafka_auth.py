"""The operator's librdkafka security properties, translated for aiokafka (faust's client).

Role: the DAG resolver runs on faust-streaming, whose Kafka client is aiokafka, not
librdkafka; it must reach the same secured cluster from the same ``DUETIME_KAFKA_*``
variables as every other role. :func:`aiokafka_auth` reads the security subset of
:class:`~duetime.core.kafka_properties.KafkaProperties` into :class:`AiokafkaAuth`, whose
:meth:`~AiokafkaAuth.kwargs` are aiokafka's client arguments (and whose fields map one to one
onto ``faust.SASLCredentials`` / ``faust.SSLCredentials``).

Guarantees: a security property aiokafka cannot honour (OAUTHBEARER without a token provider,
GSSAPI, inline PEM certificates or keys, ...) raises ConfigError naming where it was set,
instead of silently connecting with less security than configured. Properties outside the
security subset (tuning) are listed in ``ignored``: aiokafka has its own names for them.
The password is never part of ``repr`` or of an error.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .kafka_properties import KafkaProperties

_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_TRANSLATED = frozenset(
    {
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",  # librdkafka's alias of sasl.mechanism
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "enable.ssl.certificate.verification",
        "ssl.endpoint.identification.algorithm",
    }
)


@dataclass(frozen=True)
class AiokafkaAuth:
    """aiokafka's view of the security properties (see :func:`aiokafka_auth`)."""

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_location: str | None = None
    certificate_location: str | None = None
    key_location: str | None = None
    key_password: str | None = field(default=None, repr=False)
    verify_certificate: bool = True
    check_hostname: bool = True
    ignored: tuple[str, ...] = ()
    """Properties set by the operator that aiokafka does not take (tuning)."""

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context (reads the CA, certificate and key files), or None without TLS.

        Raises ConfigError naming the file that could not be loaded."""
        if not self.uses_tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        try:
            if self.ca_location is not None:
                context.load_verify_locations(self.ca_location)
            if self.certificate_location is not None:
                context.load_cert_chain(
                    self.certificate_location, self.key_location, self.key_password
                )
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"the Kafka TLS files could not be loaded ({type(exc).__name__}: "
                f"{getattr(exc, 'strerror', None) or exc.args[-1]}); check "
                f"ssl.ca.location={self.ca_location}, ssl.certificate.location="
                f"{self.certificate_location}, ssl.key.location={self.key_location}",
                details={"variable": "DUETIME_KAFKA_SSL_*"},
            ) from None
        context.check_hostname = self.check_hostname and self.verify_certificate
        if not self.verify_certificate:
            context.verify_mode = ssl.CERT_NONE
        return context

    def kwargs(self) -> dict[str, Any]:
        """aiokafka client arguments (AIOKafkaProducer/Consumer/AdminClient)."""
        out: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.uses_tls:
            out["ssl_context"] = self.ssl_context()
        if self.sasl_mechanism is not None:
            out.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.username,
                sasl_plain_password=self.password,
            )
        return out


def aiokafka_auth(props: KafkaProperties) -> AiokafkaAuth:
    """The security properties in aiokafka's terms; raises ConfigError for what it lacks."""
    values = props.as_dict()

    def refuse(name: str, why: str) -> ConfigError:
        return ConfigError(
            f"{props.source(name)} sets {name}={props.redacted().get(name)}, which the DAG "
            f"resolver's Kafka client (aiokafka) cannot honour: {why}",
            details={"variable": props.source(name), "property": name},
        )

    protocol = values.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in _PROTOCOLS:
        raise refuse("security.protocol", f"use one of {', '.join(_PROTOCOLS)}")
    mechanism_name = "sasl.mechanism" if "sasl.mechanism" in values else "sasl.mechanisms"
    mechanism: str | None = None
    if protocol.startswith("SASL_"):
        mechanism = values.get(mechanism_name, "GSSAPI").upper()  # librdkafka's default
        if mechanism not in _MECHANISMS:
            why = f"it speaks {', '.join(_MECHANISMS)}"
            if mechanism == "OAUTHBEARER":
                why += "; OAUTHBEARER needs a token provider written for aiokafka"
            if mechanism_name not in values:
                raise ConfigError(
                    "SASL without sasl.mechanism means GSSAPI (Kerberos), which the DAG "
                    f"resolver's Kafka client cannot do: {why}",
                    details={"variable": props.source("security.protocol")},
                )
            raise refuse(mechanism_name, why)
    for name in ("ssl.ca.pem", "ssl.certificate.pem", "ssl.key.pem", "ssl.keystore.location"):
        if name in values:
            raise refuse(name, "give the PEM files by location (ssl.*.location) instead")
    algorithm = values.get("ssl.endpoint.identification.algorithm", "https").lower()
    verify = values.get("enable.ssl.certificate.verification", "true").lower()
    return AiokafkaAuth(
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        username=values.get("sasl.username"),
        password=values.get("sasl.password"),
        ca_location=values.get("ssl.ca.location"),
        certificate_location=values.get("ssl.certificate.location"),
        key_location=values.get("ssl.key.location"),
        key_password=values.get("ssl.key.password"),
        verify_certificate=verify not in ("false", "0", "no", "off"),
        check_hostname=algorithm != "none",
        ignored=tuple(sorted(n for n in values if n not in _TRANSLATED)),
    )
