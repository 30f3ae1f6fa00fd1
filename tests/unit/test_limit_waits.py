"""The worker's limit waits (consumers/worker/limits.py): priority order among waiters, one
let go at a time, woken by a local slot, nothing lost or kept after a drop; key resolution."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.consumers.worker import limits
from duetime.consumers.worker.leases import Limits
from duetime.consumers.worker.limits import CONCURRENCY_RECHECK_S, FALLBACK_S, LimitWaits
from duetime.core.models import Priority, Trigger
from duetime.core.records import ConcurrencyLimit, ExecutionRequest, HttpTarget, RateLimit

C = Limits(concurrency_key="k", concurrency_limit=1)


def _request(
    concurrency: ConcurrencyLimit | None = None, rate_limit: RateLimit | None = None
) -> ExecutionRequest:
    return replace(
        ExecutionRequest(
            execution_id="00000000-0000-0000-0000-000000000001",
            job_id="00000000-0000-0000-0000-000000000002",
            name="j",
            attempt=1,
            scheduled_at_ms=0,
            due_at_ms=0,
            emitted_at_ms=0,
            priority=Priority.NORMAL,
            target=HttpTarget(url="https://example.com"),
            payload_json='{"tenant": "acme", "n": 3}',
            timeout_s=10.0,
            trigger=Trigger.SCHEDULE,
        ),
        concurrency=concurrency,
        rate_limit=rate_limit,
    )


def test_a_refused_key_blocks_newcomers_until_its_time() -> None:
    waits = LimitWaits(random.Random(1))
    assert waits.blocking(C) is None
    waits.park("a", "c:k", Priority.NORMAL, 0.0, now=10.0, retry_in_s=0.0)
    assert waits.blocking(C) == "c:k"
    waits.park("b", "c:k", Priority.NORMAL, 1.0, now=10.0)  # a newcomer joins, no claim
    assert list(waits.due(10.0)) == []  # the concurrency recheck is not due yet
    assert list(waits.due(10.0 + 1.5 * CONCURRENCY_RECHECK_S)) == ["a"]  # one at a time
    assert waits.counts() == {"concurrency": 1, "rate": 0}


def test_waiters_go_in_priority_order_then_arrival() -> None:
    waits = LimitWaits(random.Random(1))
    waits.park("low", "r:k", Priority.LOW, 0.0, now=0.0, retry_in_s=0.5)
    waits.park("normal-late", "r:k", Priority.NORMAL, 5.0, now=0.0)
    waits.park("normal-early", "r:k", Priority.NORMAL, 1.0, now=0.0)
    waits.park("critical", "r:k", Priority.CRITICAL, 9.0, now=0.0)
    order = []
    now = 0.5
    while len(waits):
        got = list(waits.due(now))
        order += got
        if got:
            waits.wake("r:k", now)  # its claim succeeded: the next may try at once
        now += 0.01
    assert order == ["critical", "normal-early", "normal-late", "low"]


def test_a_rate_refusal_waits_exactly_the_time_it_was_told() -> None:
    waits = LimitWaits()
    waits.park("a", "r:k", Priority.NORMAL, 0.0, now=100.0, retry_in_s=0.75)
    assert list(waits.due(100.74)) == []
    assert list(waits.due(100.75)) == ["a"]


def test_a_local_slot_wakes_the_key_at_once() -> None:
    waits = LimitWaits()
    waits.park("a", "c:k", Priority.NORMAL, 0.0, now=0.0, retry_in_s=0.0)
    waits.wake("c:k", 0.01)
    assert list(waits.due(0.01)) == ["a"]


def test_a_let_go_waiter_that_vanishes_does_not_block_the_key() -> None:
    """The waiter let go is dropped (a rebalance) before it claims: the next goes after the
    fallback time, so a key never stays blocked with waiters."""
    waits = LimitWaits()
    for name in ("a", "b"):
        waits.park(name, "c:k", Priority.NORMAL, 0.0, now=0.0, retry_in_s=0.0)
    first = list(waits.due(1.0))
    assert len(first) == 1
    assert list(waits.due(1.0 + FALLBACK_S / 2)) == []
    assert len(list(waits.due(1.0 + FALLBACK_S))) == 1
    assert len(waits) == 0 and waits.blocking(C) is None


@given(st.lists(st.tuples(st.sampled_from(["c:a", "c:b", "r:a"]), st.booleans()), max_size=60))
def test_every_waiter_is_let_go_or_dropped_exactly_once(entries: list[tuple[str, bool]]) -> None:
    waits = LimitWaits(random.Random(0))
    dropped_keys = set()
    for index, (wait_key, drop) in enumerate(entries):
        waits.park(f"i{index}", wait_key, Priority.NORMAL, float(index), now=0.0, retry_in_s=0.1)
        if drop:
            dropped_keys.add(f"i{index}")
    assert set(waits.drop(lambda key: key in dropped_keys)) == dropped_keys
    seen: list[str] = []
    now = 0.0
    for _ in range(10 * len(entries) + 1):
        now += FALLBACK_S
        seen += waits.due(now)
    assert sorted(seen) == sorted(
        f"i{i}" for i in range(len(entries)) if f"i{i}" not in dropped_keys
    )
    assert len(waits) == 0 and waits.counts() == {"concurrency": 0, "rate": 0}


def test_resolve_reads_the_payload_and_names_the_field() -> None:
    assert limits.resolve(_request()) is None
    got = limits.resolve(
        _request(
            concurrency=ConcurrencyLimit(key="t-{payload.tenant}", limit=2),
            rate_limit=RateLimit(key="n{payload.n}", per_s=1.5, burst=3),
        )
    )
    assert got == Limits(
        concurrency_key="t-acme", concurrency_limit=2, rate_key="n3", per_s=1.5, burst=3
    )
    assert limits.wait_keys(got) == ("c:t-acme", "r:n3")
    with pytest.raises(ValueError, match=r"rate_limit.key placeholder \{payload.zone\}"):
        limits.resolve(_request(rate_limit=RateLimit(key="{payload.zone}", per_s=1, burst=1)))


_scalars = st.one_of(st.text(max_size=8), st.integers(-(10**6), 10**6), st.booleans(), st.none())


@given(
    tenant=_scalars,
    pad=st.sampled_from([0, 2000]),  # a payload the cache does not keep, and one it does
    ctemplate=st.sampled_from([None, "t-{payload.tenant}", "fixed", "{payload.missing}", "{"]),
    rtemplate=st.sampled_from([None, "{payload.tenant}/r", "r"]),
    repeat=st.integers(1, 3),
)
def test_resolve_answers_the_same_cached_or_not(
    tenant: object, pad: int, ctemplate: str | None, rtemplate: str | None, repeat: int
) -> None:
    """The remembered keys of a payload (up to 1 KB) are what resolving it anew gives, every
    time: the same keys, or the same error naming the field."""
    import json

    payload = json.dumps({"tenant": tenant, "pad": "x" * pad})
    request = replace(
        _request(
            concurrency=None if ctemplate is None else ConcurrencyLimit(key=ctemplate, limit=2),
            rate_limit=None if rtemplate is None else RateLimit(key=rtemplate, per_s=1, burst=1),
        ),
        payload_json=payload,
    )

    def outcome(resolve: Any) -> object:
        try:
            return resolve()
        except ValueError as exc:
            return f"{type(exc).__name__}: {exc}"

    def fresh() -> tuple[str | None, str | None]:
        return limits._keys(ctemplate, rtemplate, payload)

    expected = outcome(fresh)
    for _ in range(repeat):
        got = outcome(lambda: limits.resolve(request))
        if isinstance(expected, str):
            assert got == expected
            assert expected.startswith("KeyTemplateError: ") and (
                "concurrency.key" in expected or "rate_limit.key" in expected
            )
        elif got is not None:
            assert isinstance(got, Limits)
            assert (got.concurrency_key, got.rate_key) == expected
        else:
            assert ctemplate is None and rtemplate is None


def test_a_constant_key_does_not_parse_the_payload() -> None:
    """A key without placeholders resolves whatever the payload (it is never read)."""
    request = replace(
        _request(concurrency=ConcurrencyLimit(key="one-at-a-time", limit=1)),
        payload_json="not json {",
    )
    got = limits.resolve(request)
    assert got is not None and got.concurrency_key == "one-at-a-time"
    with pytest.raises(ValueError):  # a key reading that payload: the parse error, as before
        limits.resolve(replace(request, concurrency=ConcurrencyLimit(key="{payload.a}", limit=1)))


@pytest.mark.parametrize(
    "extra",
    [
        {"concurrency": ConcurrencyLimit(key="k", limit=0)},
        {"rate_limit": RateLimit(key="k", per_s=0.0, burst=1)},
        {"rate_limit": RateLimit(key="k", per_s=float("nan"), burst=1)},
        {"rate_limit": RateLimit(key="k", per_s=1.0, burst=0)},
    ],
)
def test_numbers_no_job_can_carry_are_refused(extra: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        limits.check_limits(_request(**extra))
