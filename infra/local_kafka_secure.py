"""A local Kafka 4.1 broker with a SASL_SSL listener: TLS from a CA made here, SCRAM and PLAIN.

Role: let tests prove that duetime's clients reach a secured broker configured through
``DUETIME_KAFKA_*`` variables alone. It is :class:`~infra.local_kafka.LocalKafka` (same jars,
same one-node KRaft settings, same start/stop guarantees) with:

- a throwaway certificate authority and a broker certificate for ``127.0.0.1``/``localhost``
  made with ``openssl`` in ``home/tls`` (``ca.pem`` is what clients trust);
- a ``SASL_SSL`` listener on ``port`` (the one clients get) accepting SCRAM-SHA-256,
  SCRAM-SHA-512 and PLAIN, plus a plaintext listener on ``internal_port`` that only the
  broker itself uses (inter-broker traffic of the one node); both bound to 127.0.0.1;
- SCRAM users created when the KRaft storage is formatted (``--add-scram``, KRaft has no
  ZooKeeper to hold them), PLAIN users in the listener's JAAS configuration;
- with ``mtls_port``, an ``SSL`` listener there that requires a client certificate signed by
  the same CA (:meth:`SecureLocalKafka.issue_client_certificate` makes one).

No authorizer is configured: authentication is what is under test, every user may do
anything. Passwords are for a throwaway broker; they are never logged.
"""

from __future__ import annotations

import re
import secrets
import subprocess
from collections.abc import Mapping
from pathlib import Path

from .local_kafka import LocalKafka
from .process import InfraError, ensure_port_free

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_SAFE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # fits --add-scram and JAAS without quoting


class SecureLocalKafka(LocalKafka):
    """A single-node broker whose client listener is SASL_SSL (see the module docstring)."""

    def __init__(
        self,
        home: Path,
        port: int,
        controller_port: int,
        internal_port: int,
        users: Mapping[str, str],
        heap_mb: int = 384,
        jar_cache: Path | None = None,
        mtls_port: int | None = None,
    ) -> None:
        super().__init__(home, port, controller_port, heap_mb=heap_mb, jar_cache=jar_cache)
        if not users:
            raise ValueError("a SASL broker needs at least one user")
        for name, password in users.items():
            if not (_SAFE_RE.match(name) and _SAFE_RE.match(password)):
                raise ValueError(
                    f"user {name!r}: names and passwords may hold only letters, digits, '_' "
                    "and '-' (they are written into --add-scram and JAAS unquoted)"
                )
        self.internal_port = internal_port
        self.mtls_port = mtls_port
        self.users = dict(users)
        self.tls_dir = self.home / "tls"
        self.ca_file = self.tls_dir / "ca.pem"
        self._keystore = self.tls_dir / "broker.p12"
        self._keystore_password_file = self.tls_dir / "keystore.password"

    # ------------------------------------------------------------------ public API

    def start(self, timeout_s: float = 120) -> float:
        """Make the TLS material (once per ``home``), then start as LocalKafka does."""
        self.home.mkdir(parents=True, exist_ok=True)
        if self.pid is None:  # a live broker of this home (reused) holds it itself
            ensure_port_free(self.internal_port, "Kafka (internal listener)")
            if self.mtls_port is not None:
                ensure_port_free(self.mtls_port, "Kafka (mutual TLS listener)")
        self._ensure_tls()
        return super().start(timeout_s)

    def client_env(self, user: str, mechanism: str = "SCRAM-SHA-256") -> dict[str, str]:
        """The ``DUETIME_KAFKA_*`` variables of a duetime client logging in as ``user``."""
        return {
            "DUETIME_KAFKA_BOOTSTRAP": self.bootstrap,
            "DUETIME_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "DUETIME_KAFKA_SASL_MECHANISM": mechanism,
            "DUETIME_KAFKA_SASL_USERNAME": user,
            "DUETIME_KAFKA_SASL_PASSWORD": self.users[user],
            "DUETIME_KAFKA_SSL_CA_LOCATION": str(self.ca_file),
        }

    def issue_client_certificate(self, name: str, key_password: str) -> tuple[Path, Path]:
        """A client certificate for ``CN=name`` signed by the broker's CA, and its private key
        encrypted with ``key_password``: (certificate file, key file). Call after start."""
        if not (_SAFE_RE.match(name) and _SAFE_RE.match(key_password)):
            raise ValueError("names and key passwords may hold only letters, digits, '_', '-'")
        d = self.tls_dir
        cert, key = d / f"client-{name}.pem", d / f"client-{name}.key"
        (d / "client.ext").write_text("extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n")
        _openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-keyout", key, "-passout", f"pass:{key_password}",
            "-out", d / f"client-{name}.csr", "-subj", f"/CN={name}",
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", d / f"client-{name}.csr", "-CA", self.ca_file,
            "-CAkey", d / "ca.key", "-CAcreateserial", "-out", cert,
            "-days", "7", "-extfile", d / "client.ext",
        )  # fmt: skip
        return cert, key

    @property
    def mtls_bootstrap(self) -> str:
        """The ``bootstrap.servers`` of the mutual TLS listener."""
        if self.mtls_port is None:
            raise InfraError("this broker has no mutual TLS listener (mtls_port)")
        return f"127.0.0.1:{self.mtls_port}"

    def client_conf(self) -> dict[str, str]:
        """librdkafka properties of the first user (SCRAM-SHA-256): the readiness probe."""
        user = next(iter(self.users))
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": user,
            "sasl.password": self.users[user],
            "ssl.ca.location": str(self.ca_file),
        }

    def server_properties(self) -> str:
        base = super().server_properties()
        # The base file's plaintext listener becomes the internal one; the client port
        # becomes the SASL_SSL listener.
        plain = f"PLAINTEXT://127.0.0.1:{self.port}"
        internal = f"PLAINTEXT://127.0.0.1:{self.internal_port}"
        secure = f"SASL_SSL://127.0.0.1:{self.port}"
        replaced = base.replace(f"listeners={plain},", f"listeners={internal},{secure},").replace(
            f"advertised.listeners={plain}", f"advertised.listeners={internal},{secure}"
        )
        replaced = replaced.replace(
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,",
        )
        if replaced.count(secure) != 2 or "SASL_SSL:SASL_SSL" not in replaced:
            raise InfraError("the base broker properties changed shape: cannot add SASL_SSL")
        mtls = ""
        if self.mtls_port is not None:
            ssl_listener = f"SSL://127.0.0.1:{self.mtls_port}"
            replaced = (
                replaced.replace(f"{secure},CONTROLLER", f"{secure},{ssl_listener},CONTROLLER")
                .replace(
                    f"advertised.listeners={internal},{secure}",
                    f"advertised.listeners={internal},{secure},{ssl_listener}",
                )
                .replace("SASL_SSL:SASL_SSL,", "SASL_SSL:SASL_SSL,SSL:SSL,")
            )
            if replaced.count(ssl_listener) != 2 or "SSL:SSL," not in replaced:
                raise InfraError("the base broker properties changed shape: cannot add SSL")
            # only this listener asks for client certificates, checked against the test CA
            mtls = f"""\
listener.name.ssl.ssl.client.auth=required
ssl.truststore.type=PEM
ssl.truststore.location={self.ca_file}
"""
        plain_users = " ".join(f'user_{n}="{p}"' for n, p in self.users.items())
        password = self._keystore_password_file.read_text().strip()
        scram_jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        plain_jaas = (
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
        )
        return (
            replaced
            + f"""
# --- SASL_SSL (infra/local_kafka_secure.py) ---
sasl.enabled.mechanisms={",".join(SCRAM_MECHANISMS)},PLAIN
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config={scram_jaas}
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={scram_jaas}
listener.name.sasl_ssl.plain.sasl.jaas.config={plain_jaas}
ssl.keystore.type=PKCS12
ssl.keystore.location={self._keystore}
ssl.keystore.password={password}
ssl.key.password={password}
# server authentication only on SASL_SSL: clients prove who they are with SASL
ssl.client.auth=none
{mtls}"""
        )

    # ------------------------------------------------------------------ internals

    def _format_args(self) -> list[str]:
        args = []
        for name, password in self.users.items():
            for mechanism in SCRAM_MECHANISMS:
                args += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
        return args

    def _ensure_tls(self) -> None:
        """A CA and a broker certificate signed by it, in a PKCS12 keystore (made once)."""
        if self._keystore.exists() and self.ca_file.exists():
            return
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        password = secrets.token_hex(16)
        d = self.tls_dir
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        (d / "broker.ext").write_text(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "extendedKeyUsage=serverAuth\n"
            "basicConstraints=CA:FALSE\n"
        )
        _openssl(
            "req", "-x509", *ec, "-keyout", d / "ca.key", "-out", d / "ca.pem.partial",
            "-days", "7", "-subj", "/CN=duetime test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        _openssl(
            "req", *ec, "-keyout", d / "broker.key", "-out", d / "broker.csr",
            "-subj", "/CN=127.0.0.1",
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", d / "broker.csr", "-CA", d / "ca.pem.partial",
            "-CAkey", d / "ca.key", "-CAcreateserial", "-out", d / "broker.pem",
            "-days", "7", "-extfile", d / "broker.ext",
        )  # fmt: skip
        _openssl(
            "pkcs12", "-export", "-in", d / "broker.pem", "-inkey", d / "broker.key",
            "-certfile", d / "ca.pem.partial", "-name", "broker",
            "-out", d / "broker.p12", "-passout", f"pass:{password}",
        )  # fmt: skip
        self._keystore_password_file.write_text(password + "\n")
        # ca.pem last: its presence (with the keystore) marks the material complete
        (d / "ca.pem.partial").replace(self.ca_file)


def _openssl(*args: str | Path) -> None:
    cmd = ["openssl", *(str(a) for a in args)]
    try:
        res = subprocess.run(
            cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfraError(f"openssl {args[0]} failed: {exc}") from None
    if res.returncode != 0:
        # the arguments hold the keystore password: name the step, quote only stderr
        raise InfraError(f"openssl {args[0]} failed (exit {res.returncode}): {res.stderr[-2000:]}")
