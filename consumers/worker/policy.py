"""What a worker lets a job reach: pure policies, checked at run time on every attempt.

Records can reach the execution topics without passing the API's validation (an old record, a
producer with broker access), so the worker decides again, from its own settings:

- **Egress** (:class:`EgressPolicy`): which IP addresses an HTTP target may connect to. Always
  denied, whatever the operator allows: unspecified / "this network" (0.0.0.0/8, ``::``),
  link-local (169.254.0.0/16, fe80::/10: the cloud metadata services live there), multicast,
  broadcast and reserved ranges, documentation and benchmarking ranges, the cloud metadata
  addresses outside link-local (Alibaba's 100.100.100.200, AWS's fd00:ec2::254), Teredo and
  IPv4-compatible IPv6. Denied unless ``DUETIME_WORKER_EGRESS_ALLOW`` allows it: loopback
  (127.0.0.0/8, ::1; keyword ``loopback``) and private ranges (10/8, 172.16/12, 192.168/16,
  100.64/10, fc00::/7; keyword ``private``), or any CIDR listed there. IPv6 forms that carry
  an IPv4 address (``::ffff:a.b.c.d``, 6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``) are judged
  as that IPv4 address.
- **Kafka topics** (:func:`topic_refusal`): never duetime's own (under the topic prefix, or
  ``duetime.``) nor Kafka's internal ones (``__*``); with ``DUETIME_WORKER_KAFKA_TOPICS`` set,
  only the topics listed there (an entry ending in ``*`` is a prefix).
- **HTTP headers** (:func:`header_refusal`): a job may not set the headers that frame or route
  the request (``Host``, ``Content-Length``, ``Transfer-Encoding``, ...): only the client does.
- **Secrets** (:func:`substitute_secrets`): ``${secret:NAME}`` in a header value becomes the
  worker's ``DUETIME_SECRET_<NAME>``; a secret the worker lacks is named in the error, its
  value never is.

Each returns a reason (a sentence naming the rule) or None; nothing here does I/O.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from duetime.core.errors import ConfigError
from duetime.core.inputs import header_refusal as header_refusal  # the edge's rule, again here
from duetime.core.redact import SECRET_REF_RE
from duetime.core.topics import Topics

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

# (network, rule): denied whatever DUETIME_WORKER_EGRESS_ALLOW says. Order: the first match
# names the rule, so the specific entries come before the ranges that contain them.
_ALWAYS_DENIED: tuple[tuple[IPNetwork, str], ...] = (
    (_V4("100.100.100.200/32"), "a cloud metadata address"),
    (_V6("fd00:ec2::254/128"), "a cloud metadata address"),
    (_V4("0.0.0.0/8"), "'this network' (0.0.0.0/8)"),
    (_V4("169.254.0.0/16"), "link-local (169.254.0.0/16, where cloud metadata services live)"),
    (_V4("192.0.0.0/24"), "reserved for IETF protocol assignments (192.0.0.0/24)"),
    (_V4("192.0.2.0/24"), "a documentation range"),
    (_V4("198.51.100.0/24"), "a documentation range"),
    (_V4("203.0.113.0/24"), "a documentation range"),
    (_V4("198.18.0.0/15"), "a benchmarking range (198.18.0.0/15)"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved or broadcast (240.0.0.0/4)"),
    (_V6("::/128"), "the unspecified address"),
    (_V6("fe80::/10"), "link-local (fe80::/10)"),
    (_V6("fec0::/10"), "site-local (fec0::/10, deprecated)"),
    (_V6("ff00::/8"), "multicast"),
    (_V6("100::/64"), "discard-only (100::/64)"),
    (_V6("2001:db8::/32"), "a documentation range"),
    (_V6("2001::/32"), "Teredo (2001::/32: the IPv4 address it reaches is hidden)"),
    (_V6("64:ff9b:1::/48"), "local-use NAT64 (64:ff9b:1::/48)"),
)
_LOOPBACK: tuple[IPNetwork, ...] = (_V4("127.0.0.0/8"), _V6("::1/128"))
_PRIVATE: tuple[IPNetwork, ...] = (
    _V4("10.0.0.0/8"),
    _V4("172.16.0.0/12"),
    _V4("192.168.0.0/16"),
    _V4("100.64.0.0/10"),
    _V6("fc00::/7"),
)
_V4_COMPATIBLE = _V6("::/96")
_NAT64 = _V6("64:ff9b::/96")
_V4_TRANSLATED = _V6("::ffff:0:0:0/96")  # SIIT (RFC 2765)


def embedded_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address routes to (mapped, 6to4, NAT64), if any."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or ip in _V4_TRANSLATED:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


@dataclass(frozen=True)
class EgressPolicy:
    """Which addresses HTTP targets may connect to (see the module docstring)."""

    loopback: bool = False
    private: bool = False
    networks: tuple[IPNetwork, ...] = ()
    """Explicitly allowed CIDRs (never overriding the always-denied ranges)."""

    @classmethod
    def parse(
        cls, items: Iterable[str], variable: str = "DUETIME_WORKER_EGRESS_ALLOW"
    ) -> EgressPolicy:
        loopback = private = False
        networks: list[IPNetwork] = []
        for raw in items:
            item = raw.strip().lower()
            if item == "loopback":
                loopback = True
            elif item == "private":
                private = True
            else:
                try:
                    networks.append(ipaddress.ip_network(item, strict=True))
                except ValueError as exc:
                    raise ConfigError(
                        f"{variable}: {raw!r} is neither 'loopback', 'private' nor a CIDR ({exc})",
                        details={"variable": variable},
                    ) from None
        return cls(loopback=loopback, private=private, networks=tuple(networks))

    def describe(self) -> str:
        parts = (["loopback"] if self.loopback else []) + (["private"] if self.private else [])
        return ",".join(parts + [str(n) for n in self.networks]) or "public addresses only"

    def refusal(self, ip: IPAddress) -> str | None:
        """None when ``ip`` may be connected to; otherwise the rule that denies it."""
        inner = embedded_v4(ip)
        if inner is not None:
            why = self.refusal(inner)
            return None if why is None else f"{why} (as {ip}, which carries {inner})"
        for network, rule in _ALWAYS_DENIED:
            if ip.version == network.version and ip in network:
                return f"{rule}: always denied"
        if isinstance(ip, ipaddress.IPv6Address) and ip in _V4_COMPATIBLE and ip != _ONE:
            return "IPv4-compatible IPv6 (::/96, deprecated): always denied"
        if any(ip.version == n.version and ip in n for n in self.networks):
            return None
        if any(ip.version == n.version and ip in n for n in _LOOPBACK):
            return None if self.loopback else _unless("loopback", "loopback")
        if any(ip.version == n.version and ip in n for n in _PRIVATE):
            return None if self.private else _unless("a private range", "private")
        return None


_ONE = ipaddress.IPv6Address("::1")


def _unless(what: str, keyword: str) -> str:
    return f"{what}: denied unless DUETIME_WORKER_EGRESS_ALLOW includes {keyword!r} or its CIDR"


def parse_ip(host: str) -> IPAddress | None:
    """``host`` as an IP address when it is a literal one (brackets and zone ids allowed)."""
    text = host.strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


# --- Kafka topics -------------------------------------------------------------------------

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
RESERVED_TOPIC_PREFIX = "duetime."


def topic_refusal(topic: str, prefix: str, allowed: tuple[str, ...] = ()) -> str | None:
    """None when a Kafka target may publish to ``topic``; otherwise the rule that forbids it.

    ``prefix`` is the deployment's topic prefix; ``allowed`` the optional allow-list
    (``DUETIME_WORKER_KAFKA_TOPICS``: exact names, or prefixes ending in ``*``).
    """
    if not _TOPIC_RE.match(topic) or topic in (".", ".."):
        return f"{topic!r} is not a valid Kafka topic name"
    if topic.startswith("__"):
        return f"topic {topic!r} is internal to Kafka ('__' prefix): never a target"
    if topic.startswith(RESERVED_TOPIC_PREFIX):
        return f"topic {topic!r} is in duetime's reserved namespace ('duetime.'): never a target"
    if prefix and topic.startswith(prefix):
        return f"topic {topic!r} is under duetime's topic prefix {prefix!r}: never a target"
    if not prefix and _is_duetime_topic_without_prefix(topic):
        return f"topic {topic!r} is one of duetime's own topics: never a target"
    if allowed and not any(
        topic.startswith(a[:-1]) if a.endswith("*") else topic == a for a in allowed
    ):
        return f"topic {topic!r} is not in DUETIME_WORKER_KAFKA_TOPICS"
    return None


def _is_duetime_topic_without_prefix(topic: str) -> bool:
    # with an empty prefix duetime's topics have bare names; the resolver's (its consumer
    # group, by-run table and changelogs) all start with its app id, "resolver"
    names = {spec.name for spec in Topics("").specs(1)}
    return topic in names or topic.startswith(("resolver", "workers", "schedulers"))


def check_topic_allow_list(items: tuple[str, ...], variable: str) -> tuple[str, ...]:
    for item in items:
        name = item[:-1] if item.endswith("*") else item
        if not name or not _TOPIC_RE.match(name) or "*" in name:
            raise ConfigError(
                f"{variable}: {item!r} is not a topic name (or a prefix ending in '*')",
                details={"variable": variable},
            )
    return items


# --- HTTP headers and secrets -------------------------------------------------------------


class MissingSecret(Exception):
    """A header references ``${secret:NAME}`` and the worker has no ``DUETIME_SECRET_NAME``."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"the target references the secret {name!r}, which this worker does not have "
            f"(set DUETIME_SECRET_{name} in the worker's environment)"
        )
        self.name = name


def substitute_secrets(headers: Mapping[str, str], secrets: Mapping[str, str]) -> dict[str, str]:
    """The headers with every ``${secret:NAME}`` replaced by the worker's secret NAME.

    Raises :class:`MissingSecret` naming the first unknown secret. The caller must never log
    what this returns.
    """

    def value_of(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in secrets:
            raise MissingSecret(name)
        return secrets[name]

    return {name: SECRET_REF_RE.sub(value_of, value) for name, value in headers.items()}


SECRET_ENV_PREFIX = "DUETIME_SECRET_"
_SECRET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def secrets_from_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """``DUETIME_SECRET_<NAME>`` variables → ``{NAME: value}``, validated (a bad one is a
    :class:`ConfigError` naming the variable, never its value)."""
    found: dict[str, str] = {}
    for variable, value in environ.items():
        if not variable.startswith(SECRET_ENV_PREFIX):
            continue
        name = variable[len(SECRET_ENV_PREFIX) :]
        if not _SECRET_NAME_RE.match(name):
            raise ConfigError(
                f"{variable}: a secret's name must be letters, digits and '_' (at most 64)",
                details={"variable": variable},
            )
        if value == "" or header_refusal("X-Secret", value) is not None:
            raise ConfigError(
                f"{variable} is empty or holds a line break or control character "
                "(it would be sent as a header value)",
                details={"variable": variable},
            )
        found[name] = value
    return found
