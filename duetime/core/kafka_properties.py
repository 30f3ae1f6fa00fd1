"""librdkafka properties from the environment: ``DUETIME_KAFKA_<PROPERTY>`` and a properties file.

Role: let an operator give every Kafka client of duetime (each role, the SDK, the CLI) any
librdkafka property, above all TLS and SASL, without duetime knowing each one. Pure functions
and one frozen value; nothing here touches the network (the client factories in
:mod:`duetime.core.kafka` apply the properties).

The rules (docs/kafka-security.md shows them to operators):

- ``DUETIME_KAFKA_<NAME>`` sets one property: ``<NAME>`` lower-cased, a single ``_`` becomes
  ``.``, a doubled ``__`` becomes a literal ``_``. ``DUETIME_KAFKA_SASL_MECHANISM=SCRAM-SHA-256``
  sets ``sasl.mechanism``; ``DUETIME_KAFKA_LOG__LEVEL=3`` sets ``log_level``.
- ``DUETIME_KAFKA_PROPERTIES_FILE=/path`` reads a Java properties file (``key=value``,
  ``key: value``, ``#``/``!`` comments, backslash escapes and continuations) whose keys are
  used as written. A variable overrides the file's value of the same property.
- ``DUETIME_KAFKA_*`` names that are duetime's own settings (:data:`OWN_VARIABLES`) are not
  properties.
- Properties that duetime's correctness depends on (:data:`RESERVED`) and the Python client's
  callback properties are refused with an error naming where they were set.

Guarantees: a secret's value (:func:`is_secret`) never appears in ``repr``, in
:meth:`KafkaProperties.redacted`, or in any error raised here; :meth:`KafkaProperties.redact`
masks every secret value inside a text (e.g. a librdkafka error message).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

ENV_PREFIX = "DUETIME_KAFKA_"
FILE_VARIABLE = "DUETIME_KAFKA_PROPERTIES_FILE"
OWN_VARIABLES = frozenset(
    {
        "DUETIME_KAFKA_BOOTSTRAP",  # bootstrap.servers: one variable for every client
        FILE_VARIABLE,
        # the local broker of infra/ (ports, heap, log configuration), not client properties
        "DUETIME_KAFKA_PORT",
        "DUETIME_KAFKA_CONTROLLER_PORT",
        "DUETIME_KAFKA_HEAP_MB",
        "DUETIME_KAFKA_LOG4J2",
    }
)
"""``DUETIME_KAFKA_*`` variables that are duetime settings, never passed to librdkafka."""

RESERVED: Mapping[str, str] = {
    "bootstrap.servers": "set DUETIME_KAFKA_BOOTSTRAP instead",
    "metadata.broker.list": "set DUETIME_KAFKA_BOOTSTRAP instead",  # librdkafka's alias
    "group.id": "each role names its own consumer groups",
    "transactional.id": "schedulers derive one per partition (zombie fencing)",
    "enable.idempotence": "duetime's producers must not write a retried record twice",
    "enable.auto.commit": "offsets are committed after the work, or inside a transaction",
    "auto.commit.enable": "offsets are committed after the work, or inside a transaction",
    "isolation.level": "consumers must never see aborted transactions (read_committed)",
    "auto.offset.reset": "a new consumer group must read from the start (earliest)",
    "partition.assignment.strategy": "co-partitioned topics need the range assignor",
    "group.protocol": "each role picks its group protocol",
    "group.remote.assignor": "co-partitioned topics need the range assignor",
}
"""Properties an operator may not set, with the reason the error gives."""

CALLBACKS = frozenset(
    {"error_cb", "throttle_cb", "stats_cb", "oauth_cb", "on_delivery", "on_commit", "logger"}
)
"""The Python client's properties that take a callable: not settable from text."""

MASK = "***"

_SECRET_RE = re.compile(
    r"password|secret|passphrase|private|jaas|credential|oauthbearer\.config|key\.pem",
    re.IGNORECASE,
)
_NAME_RE = re.compile(r"^[a-z0-9]+(?:[._][a-z0-9]+)*$")
_FILE_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MAX_FILE_BYTES = 1 << 20  # a properties file is a few lines; refuse to slurp a wrong path


def is_secret(name: str) -> bool:
    """Whether a property's value must never be shown: passwords, OAuth client secrets,
    private keys and their passphrases, JAAS and OAUTHBEARER configs."""
    return bool(_SECRET_RE.search(name))


def property_of(variable: str) -> str:
    """``DUETIME_KAFKA_SSL_CA_LOCATION`` → ``ssl.ca.location``; ``…_LOG__LEVEL`` → ``log_level``.

    Raises ConfigError naming the variable when the result is no property name (an empty
    part, a character other than letters, digits and ``_``)."""
    if not variable.startswith(ENV_PREFIX):
        raise ConfigError(
            f"{variable} does not start with {ENV_PREFIX}", details={"variable": variable}
        )
    suffix = variable[len(ENV_PREFIX) :]
    name = "_".join(part.replace("_", ".") for part in suffix.lower().split("__"))
    if not _NAME_RE.match(name):
        raise ConfigError(
            f"{variable} does not name a Kafka client property: after {ENV_PREFIX}, write the "
            "property upper-cased with '.' as '_' and '_' as '__' "
            "(DUETIME_KAFKA_SASL_MECHANISM for sasl.mechanism)",
            details={"variable": variable},
        )
    return name


def variable_of(name: str) -> str:
    """The inverse of :func:`property_of`: ``ssl.ca.location`` → ``…_SSL_CA_LOCATION``."""
    return ENV_PREFIX + name.upper().replace("_", "__").replace(".", "_")


@dataclass(frozen=True)
class KafkaProperties:
    """librdkafka properties set by the operator, each with where it was set.

    ``items``: (property, value) pairs, sorted by property; ``sources``: (property, where)
    pairs in the same order (a variable's name, or ``FILE line N``).
    """

    items: tuple[tuple[str, str], ...] = ()
    sources: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, str]:
        """The properties, ready to merge into a client's configuration."""
        return dict(self.items)

    def redacted(self) -> dict[str, str]:
        """The properties as they may be shown: every secret's value is ``***``."""
        return {name: MASK if is_secret(name) else value for name, value in self.items}

    def source(self, name: str) -> str:
        """Where a property was set (a variable name, or the file and line)."""
        return dict(self.sources).get(name, "?")

    def redact(self, text: str) -> str:
        """``text`` with every secret value masked (longest first, so that a secret holding
        another one is masked whole)."""
        secrets = sorted(
            {value for name, value in self.items if is_secret(name) and value},
            key=len,
            reverse=True,
        )
        for value in secrets:
            text = text.replace(value, MASK)
        return text

    def __repr__(self) -> str:
        return f"KafkaProperties({self.redacted()!r})"

    def __bool__(self) -> bool:
        return bool(self.items)

    @classmethod
    def of(cls, pairs: Iterable[tuple[str, str, str]]) -> KafkaProperties:
        """From (property, value, where) triples, a later one overriding an earlier one;
        refuses reserved and callback properties, naming where they were set."""
        merged: dict[str, tuple[str, str]] = {}
        for name, value, where in pairs:
            if name in RESERVED:
                raise ConfigError(
                    f"{where} sets {name}, which duetime does not let you set: {RESERVED[name]}",
                    details={"variable": where, "property": name},
                )
            if name in CALLBACKS:
                raise ConfigError(
                    f"{where} sets {name}, which takes a Python callable and cannot be set "
                    "from text",
                    details={"variable": where, "property": name},
                )
            merged[name] = (value, where)
        names = sorted(merged)
        return cls(
            items=tuple((n, merged[n][0]) for n in names),
            sources=tuple((n, merged[n][1]) for n in names),
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> KafkaProperties:
        """The file named by ``DUETIME_KAFKA_PROPERTIES_FILE`` (if set), then every other
        ``DUETIME_KAFKA_*`` variable. Values are trimmed; an empty one is unset."""
        triples: list[tuple[str, str, str]] = []
        path = (environ.get(FILE_VARIABLE) or "").strip()
        if path:
            triples.extend(read_properties_file(Path(path)))
        for variable in sorted(environ):
            value = environ[variable].strip()
            if variable.startswith(ENV_PREFIX) and variable not in OWN_VARIABLES and value:
                triples.append((property_of(variable), value, variable))
        return cls.of(triples)


NONE = KafkaProperties()
"""No operator property (what every client had before): a shared immutable default."""


def read_properties_file(path: Path) -> list[tuple[str, str, str]]:
    """(property, value, where) of each entry of a Java properties file, in file order.

    Raises ConfigError naming the variable, the path and the line (never a value)."""
    where = f"{FILE_VARIABLE}={path}"
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"{where}: cannot read it ({exc.strerror or type(exc).__name__})",
            details={"variable": FILE_VARIABLE},
        ) from None
    if len(data) > _MAX_FILE_BYTES:
        raise ConfigError(
            f"{where}: larger than {_MAX_FILE_BYTES} bytes, which is no properties file",
            details={"variable": FILE_VARIABLE},
        )
    try:
        # Java 9+ reads properties files as UTF-8; ISO-8859-1 was the older rule.
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{where}: not UTF-8 text (byte {exc.start})", details={"variable": FILE_VARIABLE}
        ) from None
    out = []
    for line_no, key, value in parse_properties(text, where):
        # Neither the key nor the value is quoted: a line holding only a password would
        # otherwise put it into the error.
        if not _FILE_KEY_RE.match(key):
            raise ConfigError(
                f"{where} line {line_no}: the key is not a property name",
                details={"variable": FILE_VARIABLE, "line": line_no},
            )
        if not value:
            raise ConfigError(
                f"{where} line {line_no}: no value (write key=value)",
                details={"variable": FILE_VARIABLE, "line": line_no},
            )
        out.append((key, value, f"{FILE_VARIABLE} ({path} line {line_no})"))
    return out


def parse_properties(text: str, where: str = "properties") -> list[tuple[int, str, str]]:
    """(line number, key, value) of each entry of Java properties text, in order.

    The format of ``java.util.Properties.load``: a logical line continues after an odd
    number of trailing backslashes; the key ends at the first unescaped ``=``, ``:`` or
    whitespace; ``\\t \\n \\r \\f \\uXXXX`` are escapes and a backslash before any other
    character stands for that character."""
    entries = []
    # Only \n, \r and \r\n end a line (str.splitlines would also split on \x85, \u2028...)
    lines = _LINE_END_RE.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    i = 0
    while i < len(lines):
        line_no = i + 1
        logical = lines[i].lstrip(" \t\f")
        i += 1
        if not logical or logical[0] in "#!":
            continue
        while _continues(logical) and i < len(lines):
            logical = logical[:-1] + lines[i].lstrip(" \t\f")
            i += 1
        if _continues(logical):  # a continuation on the last line continues into nothing
            logical = logical[:-1]
        key_raw, value_raw = _split_entry(logical)
        entries.append(
            (line_no, _unescape(key_raw, where, line_no), _unescape(value_raw, where, line_no))
        )
    return entries


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split_entry(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "=: \t\f":
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(" \t\f")
    if line[i : i + 1] in (" ", "\t", "\f") and rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    elif line[i : i + 1] in ("=", ":"):
        rest = line[i + 1 :].lstrip(" \t\f")
    return key, rest


_LINE_END_RE = re.compile(r"\r\n|\r|\n")
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(raw: str, where: str, line_no: int) -> str:
    out = []
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch != "\\" or i + 1 >= len(raw):
            out.append(ch)
            i += 1
            continue
        nxt = raw[i + 1]
        if nxt == "u":
            digits = raw[i + 2 : i + 6]
            if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise ConfigError(
                    f"{where} line {line_no}: a \\u escape needs four hex digits",
                    details={"variable": FILE_VARIABLE, "line": line_no},
                )
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)
