"""Limited lease claims against the real PostgreSQL (migration 0009, issue 18 items 1 and 2):
slot accounting under concurrent claims from several workers (threads), a slot freed by
completion, release and expiry (with the expired holder fenced out), the rate buckets."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime.consumers.worker.leases import LIMITED, Limits
from duetime.core.keys import take_token

from .test_worker_leases import expired, new_id, opened


def _conc(key: str, limit: int) -> Limits:
    return Limits(concurrency_key=key, concurrency_limit=limit)


def _rate(key: str, per_s: float, burst: int) -> Limits:
    return Limits(rate_key=key, per_s=per_s, burst=burst)


def test_concurrency_slots_are_taken_and_freed(database_url: str) -> None:
    async def scenario() -> None:
        a = await opened(database_url, "worker-a", 30.0)
        b = await opened(database_url, "worker-b", 30.0)
        try:
            key = f"tenant-{uuid.uuid4().hex[:6]}"
            ids = [new_id() for _ in range(5)]
            answers = await asyncio.gather(
                *(
                    s.claim(e, 1, limits=_conc(key, 2))
                    for s, e in zip([a, b] * 3, ids, strict=False)
                )
            )
            won = [(e, c.token) for e, c in zip(ids, answers, strict=True) if c.token is not None]
            waiting = [c for c in answers if c.token is None]
            assert len(won) == 2
            assert {(c.conflict, c.waiting) for c in waiting} == {(LIMITED, "concurrency")}
            # another key is not affected, nor is a claim without limits
            other = await a.claim(new_id(), 1, limits=_conc(key + "-x", 1))
            assert other.token is not None
            assert (await b.claim(new_id(), 1)).token is not None
            # a completion frees one slot, a release another
            loser = [e for e in ids if e not in dict(won)]
            assert await a.complete(won[0][0], won[0][1], "success", b"r")
            assert (await b.claim(loser[0], 1, limits=_conc(key, 2))).token is not None
            assert (await b.claim(loser[1], 1, limits=_conc(key, 2))).waiting == "concurrency"
            await a.release([won[1]])
            assert (await b.claim(loser[1], 1, limits=_conc(key, 2))).token is not None
            # a finished execution is still reported done, not limited, even with no slot
            done = await b.claim(won[0][0], 1, limits=_conc(key, 2))
            assert done.conflict == "done" and done.result == b"r"
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())


def test_an_expired_lease_frees_its_slot_and_its_holder_is_fenced_out(database_url: str) -> None:
    async def scenario() -> None:
        a = await opened(database_url, "worker-a", 0.5)
        b = await opened(database_url, "worker-b", 0.5)
        try:
            key = f"seq-{uuid.uuid4().hex[:6]}"
            first, second = new_id(), new_id()
            held = await a.claim(first, 1, limits=_conc(key, 1))
            assert held.token is not None
            assert (await b.claim(second, 1, limits=_conc(key, 1))).waiting == "concurrency"
            await expired(database_url, first)  # a crashed worker stops renewing
            taken = await b.claim(second, 1, limits=_conc(key, 1))
            assert taken.token is not None
            # the old holder lost its slot: it can neither renew nor complete
            assert await a.renew([(first, held.token)]) == {first}
            assert await a.complete(first, held.token, "success", b"zombie") is False
            # the expired execution itself, redelivered, waits for the slot like any other
            again = await a.claim(first, 1, limits=_conc(key, 1))
            assert again.waiting == "concurrency"
            assert await b.complete(second, taken.token, "success", b"r")
            assert (await a.claim(first, 1, limits=_conc(key, 1))).token is not None
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())


def test_concurrent_claims_from_many_workers_never_exceed_the_limit(database_url: str) -> None:
    """Eight workers (threads, each with its own loop and pool) race for the slots of one key
    with limit 3; each holds its slot a moment, counting how many are held at once in this
    process, then completes it. The count never passes 3 and every execution runs once."""
    limit, workers, per_worker = 3, 8, 15
    key = f"race-{uuid.uuid4().hex[:6]}"
    lock = threading.Lock()
    running = [0]
    peak = [0]
    ran: list[str] = []
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        async def scenario() -> None:
            store = await opened(database_url, f"worker-{index}", 30.0)
            try:
                todo = [new_id() for _ in range(per_worker)]
                deadline = time.monotonic() + 120
                while todo:
                    assert time.monotonic() < deadline, f"worker {index}: {len(todo)} left"
                    eid = todo[0]
                    claim = await store.claim(eid, 1, limits=_conc(key, limit))
                    if claim.token is None:
                        assert claim.waiting == "concurrency"
                        await asyncio.sleep(0.005)  # let the others move
                        continue
                    with lock:
                        running[0] += 1
                        peak[0] = max(peak[0], running[0])
                        assert running[0] <= limit
                    await asyncio.sleep(0.002)
                    with lock:
                        running[0] -= 1
                        ran.append(eid)
                    assert await store.complete(eid, claim.token, "success", b"")
                    todo.pop(0)
            finally:
                await store.close()

        try:
            asyncio.run(scenario())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert not errors, errors
    assert len(ran) == len(set(ran)) == workers * per_worker
    assert 1 <= peak[0] <= limit


def test_rate_bucket_allows_burst_then_waits_per_token(database_url: str) -> None:
    async def scenario() -> None:
        a = await opened(database_url, "worker-a", 30.0)
        try:
            key = f"api-{uuid.uuid4().hex[:6]}"
            limits = _rate(key, 2.0, 3)
            answers = [await a.claim(new_id(), 1, limits=limits) for _ in range(4)]
            assert [c.token is not None for c in answers] == [True, True, True, False]
            refused = answers[3]
            assert refused.conflict == LIMITED and refused.waiting == "rate"
            # about half a second per token at 2/s (less by what refilled meanwhile)
            assert 0 < refused.retry_in_s <= 0.5
            eid = new_id()
            deadline = time.monotonic() + 10
            while (claim := await a.claim(eid, 1, limits=limits)).token is None:
                assert claim.waiting == "rate" and time.monotonic() < deadline
                await asyncio.sleep(claim.retry_in_s)
            # the bucket in the table is what take_token says it is
            async with await psycopg.AsyncConnection.connect(database_url) as conn:
                cur = await conn.execute(
                    "SELECT tokens, full_at > refilled_at FROM rate_buckets WHERE key = %s",
                    (key,),
                )
                tokens, filling = await cur.fetchone()  # type: ignore[misc]
            assert 0 <= tokens < 1 and filling
            allowed, left, wait_s = take_token(tokens, 0.0, 2.0, 3)
            assert not allowed and left == tokens and wait_s > 0
        finally:
            await a.close()

    asyncio.run(scenario())


def test_both_limits_take_a_token_only_with_a_slot(database_url: str) -> None:
    async def scenario() -> None:
        a = await opened(database_url, "worker-a", 30.0)
        try:
            suffix = uuid.uuid4().hex[:6]
            both = Limits(
                concurrency_key=f"c-{suffix}",
                concurrency_limit=1,
                rate_key=f"r-{suffix}",
                per_s=0.001,
                burst=2,
            )
            first_id = new_id()
            first = await a.claim(first_id, 1, limits=both)
            assert first.token is not None
            # refused by concurrency: no token spent, so the bucket still has one left
            for _ in range(3):
                assert (await a.claim(new_id(), 1, limits=both)).waiting == "concurrency"
            await a.release([(first_id, first.token)])
            assert (await a.claim(new_id(), 1, limits=both)).token is not None
        finally:
            await a.close()

    asyncio.run(scenario())


# --- migration 0012: the batch admitted at once must be what version 9's loop admits --------

_CLAIM_LIMITED_SQL = """
SELECT execution_id, token, waiting FROM duetime_claim_limited(
    'model', 30.0, %(ids)s::uuid[], %(attempts)s::int[], %(jobs)s::text[], %(runs)s::text[],
    %(ckeys)s::text[], %(climits)s::int[], %(rkeys)s::text[], %(rates)s::float8[],
    %(bursts)s::int[])
"""
_SLOW_RATE = 1e-9
"""Tokens per second in the model's buckets: no measurable refill while a batch runs."""

_batch = st.lists(
    st.tuples(
        st.sampled_from([None, 0, 1, 2]),  # concurrency key
        st.integers(1, 4),  # its limit (executions of one key may carry different limits)
        st.sampled_from([None, 0, 1, 2]),  # rate key
        st.booleans(),  # a redelivery of a lease held already (not claimable)
    ),
    min_size=1,
    max_size=14,
)


def _loop_model(
    batch: list[tuple[int | None, int, int | None, bool]],
    live: dict[int, int],
    tokens: dict[int, float],
) -> list[str | None]:
    """Version 9's admission loop: per execution, in order, ``None`` (admitted), the limit
    that refuses it, or ``blocked`` (not claimable: the caller inspects it)."""
    live, tokens = dict(live), dict(tokens)
    answers: list[str | None] = []
    for ckey, climit, rkey, blocked in batch:
        if blocked:
            answers.append("blocked")
        elif ckey is not None and live[ckey] >= climit:
            answers.append("concurrency")
        elif rkey is not None and tokens[rkey] < 1:
            answers.append("rate")
        else:
            answers.append(None)
            if ckey is not None:
                live[ckey] += 1
            if rkey is not None:
                tokens[rkey] -= 1
    return answers


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batch=_batch,
    held=st.lists(st.integers(0, 3), min_size=3, max_size=3),
    start_tokens=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5, 6.0]), min_size=3, max_size=3),
)
def test_a_batch_is_admitted_exactly_as_the_loop_would(
    database_url: str,
    batch: list[tuple[int | None, int, int | None, bool]],
    held: list[int],
    start_tokens: list[float],
) -> None:
    """Whatever the batch (keys, limits, free slots, tokens, redeliveries), the claim admits
    and refuses exactly what version 9's loop did, and leaves the buckets as it did: the
    all-fit shortcut of migration 0012 changes the cost, never an answer."""
    suffix = uuid.uuid4().hex[:8]
    ckeys = {k: f"c{k}-{suffix}" for k in range(3)}
    rkeys = {k: f"r{k}-{suffix}" for k in range(3)}
    with psycopg.connect(database_url, autocommit=True) as conn:
        # the keys' live slots (held leases of other executions) and their buckets
        holders = [(new_id(), ckeys[k]) for k, n in enumerate(held) for _ in range(n)]
        blocked_ids = iter([new_id() for _ in batch])
        redelivered = [next(blocked_ids) for _ in batch]
        for eid, key in holders:
            conn.execute(
                "INSERT INTO leases (execution_id, attempt, owner, fencing_token, expires_at,"
                " state, concurrency_key) VALUES (%s, 1, 'other', nextval('lease_fencing_tokens'),"
                " now() + interval '1 hour', 'held', %s)",
                (eid, key),
            )
        for eid in redelivered:  # held elsewhere, outside every key: only a redelivery sees it
            conn.execute(
                "INSERT INTO leases (execution_id, attempt, owner, fencing_token, expires_at,"
                " state) VALUES (%s, 1, 'other', nextval('lease_fencing_tokens'),"
                " now() + interval '1 hour', 'held')",
                (eid,),
            )
        for k, tokens in enumerate(start_tokens):
            conn.execute(
                "INSERT INTO rate_buckets (key, tokens, refilled_at, full_at)"
                " VALUES (%s, %s, now(), now() + interval '1 hour')",
                (rkeys[k], tokens),
            )
        ids = [
            redelivered[i] if blocked else new_id() for i, (_, _, _, blocked) in enumerate(batch)
        ]
        rows = conn.execute(
            _CLAIM_LIMITED_SQL,
            {
                "ids": ids,
                "attempts": [1] * len(batch),
                "jobs": ["job"] * len(batch),
                "runs": [None] * len(batch),
                "ckeys": [None if c is None else ckeys[c] for c, _, _, _ in batch],
                "climits": [limit for _, limit, _, _ in batch],
                "rkeys": [None if r is None else rkeys[r] for _, _, r, _ in batch],
                "rates": [_SLOW_RATE] * len(batch),
                "bursts": [10] * len(batch),
            },
        ).fetchall()
        answered = {row[0]: ("claimed" if row[1] is not None else row[2]) for row in rows}
        got = [answered.get(eid, "blocked") for eid in ids]
        expected = _loop_model(batch, dict(enumerate(held)), dict(enumerate(start_tokens)))
        assert got == ["claimed" if a is None else a for a in expected]
        # each bucket spent one token per lease taken of its key
        spent = {k: 0 for k in range(3)}
        for (_, _, rkey, _), answer in zip(batch, expected, strict=True):
            if answer is None and rkey is not None:
                spent[rkey] += 1
        for k in range(3):
            (left,) = conn.execute(  # type: ignore[misc]
                "SELECT tokens FROM rate_buckets WHERE key = %s", (rkeys[k],)
            ).fetchone()
            assert left == pytest.approx(start_tokens[k] - spent[k], abs=1e-3)
