"""The worker's run-time policies (pure): egress, python refs, Kafka topics, headers, secrets,
and the redaction of what it stores."""

from __future__ import annotations

import ipaddress
import sys
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.consumers.tasks import TaskRegistry, UnknownTarget, module_allowed, ref_refusal
from duetime.consumers.worker.policy import (
    EgressPolicy,
    MissingSecret,
    header_refusal,
    parse_ip,
    secrets_from_environ,
    substitute_secrets,
    topic_refusal,
)
from duetime.consumers.worker.results import contained, failure, from_exception
from duetime.consumers.worker.settings import WorkerSettings
from duetime.core.config import Env
from duetime.core.errors import ConfigError
from duetime.core.models import ErrorReason

V4 = ipaddress.IPv4Address
V6 = ipaddress.IPv6Address
NOTHING = EgressPolicy()
EVERYTHING = EgressPolicy(
    loopback=True,
    private=True,
    networks=(ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")),
)


def v4_in(cidr: str) -> st.SearchStrategy[ipaddress.IPv4Address]:
    net = ipaddress.IPv4Network(cidr)
    return st.integers(int(net.network_address), int(net.broadcast_address)).map(V4)


def v6_in(cidr: str) -> st.SearchStrategy[ipaddress.IPv6Address]:
    net = ipaddress.IPv6Network(cidr)
    return st.integers(int(net.network_address), int(net.broadcast_address)).map(V6)


ALWAYS_DENIED = st.one_of(
    v4_in("169.254.0.0/16"),
    v4_in("0.0.0.0/8"),
    v4_in("224.0.0.0/4"),
    v4_in("240.0.0.0/4"),
    v6_in("fe80::/10"),
    v6_in("ff00::/8"),
    st.just(V4("100.100.100.200")),
    st.just(V6("fd00:ec2::254")),
    st.just(V6("::")),
)
LOOPBACK = st.one_of(v4_in("127.0.0.0/8"), st.just(V6("::1")))
PRIVATE = st.one_of(
    v4_in("10.0.0.0/8"),
    v4_in("172.16.0.0/12"),
    v4_in("192.168.0.0/16"),
    v4_in("100.64.0.0/10").filter(lambda ip: ip != V4("100.100.100.200")),
    v6_in("fc00::/7").filter(lambda ip: ip != V6("fd00:ec2::254")),
)
POLICIES = st.builds(
    EgressPolicy,
    loopback=st.booleans(),
    private=st.booleans(),
    networks=st.lists(
        st.sampled_from(
            [
                ipaddress.ip_network(n)
                for n in ("0.0.0.0/0", "::/0", "169.254.0.0/16", "fe80::/10", "10.0.0.0/8")
            ]
        ),
        max_size=3,
    ).map(tuple),
)
ANY_V4 = st.integers(0, 2**32 - 1).map(V4)


# --- egress -------------------------------------------------------------------------------


@given(ALWAYS_DENIED, POLICIES)
def test_link_local_metadata_and_special_ranges_are_denied_whatever_the_operator_allows(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address, policy: EgressPolicy
) -> None:
    assert policy.refusal(ip) is not None
    assert EVERYTHING.refusal(ip) is not None


@given(ANY_V4, POLICIES)
def test_ipv6_forms_carrying_an_ipv4_get_the_verdict_of_that_ipv4(
    ip: ipaddress.IPv4Address, policy: EgressPolicy
) -> None:
    expected = policy.refusal(ip) is None
    mapped = V6(f"::ffff:{ip}")
    six_to_four = V6((0x2002 << 112) | (int(ip) << 80))
    nat64 = V6(int(V6("64:ff9b::")) | int(ip))
    for form in (mapped, six_to_four, nat64):
        assert (policy.refusal(form) is None) == expected, form


@given(LOOPBACK)
def test_loopback_needs_the_loopback_allowance(ip: ipaddress.IPv4Address) -> None:
    assert "loopback" in (NOTHING.refusal(ip) or "")
    assert EgressPolicy(private=True).refusal(ip) is not None
    assert EgressPolicy(loopback=True).refusal(ip) is None
    assert EgressPolicy.parse(["LoopBack"]).refusal(ip) is None


@given(PRIVATE)
def test_private_ranges_need_the_private_allowance_or_their_cidr(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    assert "private" in (NOTHING.refusal(ip) or "")
    assert EgressPolicy(loopback=True).refusal(ip) is not None
    assert EgressPolicy(private=True).refusal(ip) is None
    own = ipaddress.ip_network(f"{ip}/{ip.max_prefixlen}")
    assert EgressPolicy(networks=(own,)).refusal(ip) is None


@given(ANY_V4)
def test_public_addresses_are_allowed_and_only_they_without_allowances(
    ip: ipaddress.IPv4Address,
) -> None:
    # Python's is_global follows the IANA special-purpose registry; we deny a little more of
    # it (multicast, and 192.0.0.0/24 whole: anycast service addresses are no webhook)
    if ip.is_global and not ip.is_multicast and ip not in ipaddress.ip_network("192.0.0.0/24"):
        assert NOTHING.refusal(ip) is None, ip
    if NOTHING.refusal(ip) is None:
        assert not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast), ip


def test_the_reason_names_the_rule_and_parse_refuses_nonsense() -> None:
    assert "link-local" in (NOTHING.refusal(V4("169.254.169.254")) or "")
    assert "metadata" in (EVERYTHING.refusal(V4("100.100.100.200")) or "")
    assert "carries 127.0.0.1" in (NOTHING.refusal(V6("::ffff:127.0.0.1")) or "")
    assert parse_ip("[::1]") == V6("::1") and parse_ip("example.com") is None
    assert parse_ip("fe80::1%eth0") == V6("fe80::1")
    policy = EgressPolicy.parse(["loopback", " 10.1.0.0/16 "])
    assert policy.refusal(V4("10.1.2.3")) is None and policy.refusal(V4("10.2.0.1")) is not None
    for bad in ("localhost", "10.1.2.3/8", "300.0.0.0/8"):
        with pytest.raises(ConfigError, match="DUETIME_WORKER_EGRESS_ALLOW"):
            EgressPolicy.parse([bad])


# --- python refs --------------------------------------------------------------------------

SEGMENT = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)


@given(st.lists(SEGMENT, min_size=1, max_size=3), st.lists(SEGMENT, min_size=1, max_size=3))
def test_a_ref_is_allowed_exactly_when_its_module_is_under_an_allowed_prefix(
    module: list[str], attrs: list[str]
) -> None:
    ref = ".".join(module) + ":" + ".".join(attrs)
    assert ref_refusal(ref, [".".join(module)]) is None
    assert ref_refusal(ref, [module[0]]) is None
    assert ref_refusal(ref, []) is not None
    assert ref_refusal(ref, [module[0] + "x"]) is not None  # a prefix is a whole segment
    assert module_allowed(".".join(module), [module[0]])


@given(
    st.lists(SEGMENT, min_size=1, max_size=3),
    st.lists(SEGMENT, min_size=1, max_size=3),
    st.integers(0, 5),
    st.sampled_from(["_", "__"]),
)
def test_no_private_or_dunder_segment_is_ever_allowed(
    module: list[str], attrs: list[str], where: int, underscore: str
) -> None:
    segments = module + attrs
    index = where % len(segments)
    segments[index] = underscore + segments[index]
    ref = ".".join(segments[: len(module)]) + ":" + ".".join(segments[len(module) :])
    assert ref_refusal(ref, [segments[0].lstrip("_"), segments[0]]) is not None


@pytest.mark.parametrize(
    "ref",
    ["sys:exit", "this:s", "builtins:print", "os:path.__class__.__subclasses__", "os:system"],
)
def test_the_reviews_refs_resolve_to_nothing_and_import_nothing(ref: str) -> None:
    module = ref.partition(":")[0]
    was_loaded = module in sys.modules
    with pytest.raises(UnknownTarget):
        TaskRegistry(allowed_modules=("tests",)).resolve(ref)
    assert (module in sys.modules) == was_loaded, "checked before importing"


def test_an_allowed_module_does_not_lend_what_it_imported() -> None:
    module = types.ModuleType("duetime_policy_tasks")
    module.os = __import__("os")  # type: ignore[attr-defined]
    module.dumps = __import__("json").dumps  # type: ignore[attr-defined]

    def own(ctx: object) -> None:
        return None

    own.__module__ = module.__name__
    module.own = own  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        registry = TaskRegistry(allowed_modules=(module.__name__,))
        assert registry.resolve(f"{module.__name__}:own") is own
        with pytest.raises(UnknownTarget, match="module 'os'"):
            registry.resolve(f"{module.__name__}:os.system")
        with pytest.raises(UnknownTarget, match="defined in 'json'"):
            registry.resolve(f"{module.__name__}:dumps")
    finally:
        del sys.modules[module.__name__]


def test_registered_names_may_have_hyphens() -> None:
    registry = TaskRegistry()

    @registry.task("send-invoice")
    def send(ctx: object) -> None:
        return None

    assert registry.resolve("send-invoice") is send
    with pytest.raises(UnknownTarget, match="no task named"):
        registry.resolve("send-receipt")


# --- kafka topics -------------------------------------------------------------------------

TOPIC = st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True).filter(lambda t: t not in ".")


@given(TOPIC, st.sampled_from(["duetime.", "acme.", "t1_"]))
def test_duetime_and_kafka_internal_topics_are_never_targets(topic: str, prefix: str) -> None:
    for forbidden in (prefix + topic, "duetime." + topic, "__" + topic):
        assert topic_refusal(forbidden, prefix) is not None
        assert topic_refusal(forbidden, prefix, (forbidden, "*")) is not None


@given(TOPIC)
def test_the_allow_list_takes_exact_names_and_prefixes(topic: str) -> None:
    name = "out." + topic
    assert topic_refusal(name, "duetime.") is None
    assert topic_refusal(name, "duetime.", ("out.*",)) is None
    assert topic_refusal(name, "duetime.", (name,)) is None
    assert "DUETIME_WORKER_KAFKA_TOPICS" in (topic_refusal(name, "duetime.", ("in.*",)) or "")


def test_topic_rules_name_themselves() -> None:
    assert "prefix" in (topic_refusal("acme.jobs", "acme.") or "")
    assert "reserved" in (topic_refusal("duetime.exec.normal", "acme.") or "")
    assert "internal" in (topic_refusal("__consumer_offsets", "acme.") or "")
    assert "not a valid" in (topic_refusal("a b", "acme.") or "")
    # an empty prefix: duetime's bare names and the resolver's topics stay off-limits
    assert topic_refusal("jobs", "") is not None
    assert topic_refusal("resolver-runs-changelog", "") is not None
    assert topic_refusal("orders", "") is None


# --- headers and secrets ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "Host",
        "content-length",
        "Transfer-Encoding",
        "Connection",
        "Upgrade",
        "TE",
        "Trailer",
        "Keep-Alive",
        "Proxy-Authorization",
        "proxy-anything",
        "Expect",
    ],
)
def test_framing_and_routing_headers_are_refused(name: str) -> None:
    assert header_refusal(name, "x") is not None
    assert header_refusal("X-" + name, "x") is None


def test_header_values_with_line_breaks_and_bad_names_are_refused() -> None:
    assert header_refusal("X-A", "a\r\nHost: evil") is not None
    assert header_refusal("X A", "a") is not None
    assert header_refusal("X-A", "tab\tis fine") is None


@given(
    st.text(alphabet="abcXYZ019 -", max_size=20),
    st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True),
)
def test_secret_references_are_substituted_and_unknown_ones_named(text: str, name: str) -> None:
    headers = {"Authorization": f"Bearer ${{secret:{name}}}", "X-Plain": text}
    out = substitute_secrets(headers, {name: "s3cr3t"})
    assert out == {"Authorization": "Bearer s3cr3t", "X-Plain": text}
    with pytest.raises(MissingSecret, match=name) as raised:
        substitute_secrets(headers, {name + "X": "other-value"})
    assert "other-value" not in str(raised.value)


def test_secrets_come_from_their_variables_and_never_show_in_the_settings_repr() -> None:
    environ = {"DUETIME_SECRET_API_TOKEN": "tok-123", "OTHER": "x"}
    secrets = secrets_from_environ(environ)
    assert secrets == {"API_TOKEN": "tok-123"}
    settings = WorkerSettings.from_env(Env(environ), secrets=secrets)
    assert settings.secrets["API_TOKEN"] == "tok-123" and "tok-123" not in repr(settings)
    for bad in ({"DUETIME_SECRET_A-B": "x"}, {"DUETIME_SECRET_A": "x\ny"}):
        with pytest.raises(ConfigError) as raised:
            secrets_from_environ(bad)
        assert "x\ny" not in raised.value.message


def test_the_new_worker_variables_are_read_and_validated() -> None:
    s = WorkerSettings.from_env(
        Env(
            {
                "DUETIME_WORKER_PYTHON_MODULES": "myapp, other.jobs",
                "DUETIME_WORKER_IMPORTS": "myapp.tasks",
                "DUETIME_WORKER_KAFKA_TOPICS": "orders,events.*",
                "DUETIME_WORKER_EGRESS_ALLOW": "loopback,10.0.0.0/8",
            }
        )
    )
    assert s.allowed_modules == ("myapp", "other.jobs", "myapp.tasks")
    assert s.kafka_topics == ("orders", "events.*")
    assert s.egress.loopback and not s.egress.private
    for env, variable in (
        ({"DUETIME_WORKER_PYTHON_MODULES": "my-app"}, "DUETIME_WORKER_PYTHON_MODULES"),
        ({"DUETIME_WORKER_PYTHON_MODULES": "_private"}, "DUETIME_WORKER_PYTHON_MODULES"),
        ({"DUETIME_WORKER_KAFKA_TOPICS": "a*b"}, "DUETIME_WORKER_KAFKA_TOPICS"),
        ({"DUETIME_WORKER_EGRESS_ALLOW": "everything"}, "DUETIME_WORKER_EGRESS_ALLOW"),
    ):
        with pytest.raises(ConfigError, match=variable):
            WorkerSettings.from_env(Env(env))


# --- what the worker stores ---------------------------------------------------------------


@given(
    st.from_regex(r"[a-z]{1,8}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9]{6,20}", fullmatch=True),
)
def test_stored_error_messages_never_hold_userinfo_or_query_values(user: str, secret: str) -> None:
    url = f"https://{user}:{secret}@api.example.com/hook?api_key={secret}&x=1"
    outcome = failure("HttpStatus", f"POST {url} answered 500", retryable=True)
    assert outcome.error is not None
    assert secret not in outcome.error.message
    assert "api.example.com/hook" in outcome.error.message


def test_what_a_task_cannot_be_allowed_to_raise_is_a_permanent_failure_naming_it() -> None:
    for exc in (SystemExit(3), KeyboardInterrupt(), GeneratorExit()):
        for outcome in (contained(exc), from_exception(exc)):
            assert outcome.error is not None
            assert outcome.error.type == type(exc).__name__
            assert outcome.error.retryable is False


def test_an_exception_whose_str_raises_still_makes_an_outcome() -> None:
    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    outcome = from_exception(Nasty())
    assert outcome.error is not None and outcome.error.message == "Nasty"


def test_a_reason_the_schema_lacks_is_written_as_error() -> None:
    outcome = failure("EgressDenied", "denied", retryable=False, reason="egress_denied")
    assert outcome.error is not None
    expected = "egress_denied" if "egress_denied" in set(ErrorReason) else "error"
    assert outcome.error.reason == expected
    assert outcome.error.type == "EgressDenied"


@pytest.mark.parametrize("delay", ["soon", float("nan"), float("inf"), -1.0, True, 1e12])
def test_a_tasks_insane_retry_delay_falls_back_to_the_policy(delay: object) -> None:
    from duetime.core.errors import RetryLater

    exc = RetryLater("later")
    exc.delay_s = delay  # type: ignore[assignment]  # what a hostile task can do
    assert from_exception(exc).retry_after_s is None


# --- where the egress policy is enforced (no network: the hosts file and a local socket) ---


def test_the_resolver_drops_denied_addresses_and_refuses_a_name_with_none_left() -> None:
    import asyncio
    import socket

    from duetime.consumers.worker.http_target import EgressDenied, GuardedResolver

    async def resolve(policy: EgressPolicy) -> list[str]:
        resolver = GuardedResolver(policy)
        try:
            return [
                str(r["host"]) for r in await resolver.resolve("localhost", 80, socket.AF_UNSPEC)
            ]
        finally:
            await resolver.close()

    with pytest.raises(EgressDenied, match="loopback"):
        asyncio.run(resolve(NOTHING))
    allowed = asyncio.run(resolve(EgressPolicy(loopback=True)))
    assert allowed and all(parse_ip(a) is not None for a in allowed)


def test_the_socket_factory_refuses_a_denied_peer_on_every_connect() -> None:
    import socket

    from duetime.consumers.worker.http_target import EgressDenied, guarded_socket_factory

    info = (socket.AF_INET, socket.SOCK_STREAM, 0, "", ("169.254.169.254", 80))
    for policy in (NOTHING, EVERYTHING):
        with pytest.raises(EgressDenied, match="link-local"):
            guarded_socket_factory(policy)(info)
    sock = guarded_socket_factory(EgressPolicy(loopback=True))(
        (socket.AF_INET, socket.SOCK_STREAM, 0, "", ("127.0.0.1", 80))
    )
    sock.close()


def test_a_module_that_exits_on_import_fails_the_resolution_not_the_process() -> None:
    registry = TaskRegistry(allowed_modules=("tests",))
    with pytest.raises(UnknownTarget, match="SystemExit"):
        registry.resolve("tests.integration.worker_exits_on_import:run")


@given(
    st.lists(st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)), min_size=1, max_size=40),
    st.sampled_from([NOTHING, EVERYTHING, EgressPolicy(loopback=True)]),
)
def test_a_remembered_literal_hosts_answer_is_the_policys_own(
    ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address], policy: EgressPolicy
) -> None:
    """The caller keeps the policy's answer per IP-literal host (bounded): asked again, or
    once its memory was cleared, it answers what the policy answers; a name is not judged
    there (the resolver does)."""
    from typing import Any, cast

    from duetime.consumers.worker import http_target

    caller = http_target.HttpCaller(cast(Any, None), policy, {})
    hosts = [str(ip) if ip.version == 4 else f"[{ip}]" for ip in ips] * 2 + ["example.com"]
    for host in hosts:
        ip = parse_ip(host)
        assert caller._literal_rule(host) == (None if ip is None else policy.refusal(ip))
    assert len(caller._literal_rules) <= http_target._REMEMBERED_HOSTS
