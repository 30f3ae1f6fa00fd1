"""The scheduler store's kept decoded states (schedulers/store.py): handed out once, only what
was written since the last rollback, only for jobs in the near-term window or waiting for a
result, never more than the limit."""

from __future__ import annotations

import math
from collections import Counter
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core.models import Status
from duetime.core.records import JobDefinition, SchedulerState
from duetime.core.topics import HELD_PREFIX
from duetime.schedulers import partition as partition_module
from duetime.schedulers import store as store_module
from duetime.schedulers.store import StateStore, decoded_size
from duetime.schemas.codec import Codec

from .test_schemas import job_record

WINDOW_MS = 10_000
JOBS = ["a", "b", "c", "d"]
CODEC = Codec()
DEFINITION = CODEC.load(JobDefinition, CODEC.encode("job", job_record()))


def _state(n: int = 0) -> SchedulerState:
    """A distinct state object (the store only keeps and hands out objects)."""
    return SchedulerState(
        job_id=DEFINITION.job_id, definition=DEFINITION, status=Status.PENDING, updated_at_ms=n
    )


def test_a_written_state_is_handed_out_once() -> None:
    store = StateStore(None, WINDOW_MS)
    store.advance(0)
    state = _state()
    store.put("a", 5_000, b"x", state)
    store.commit()
    assert store.take_decoded("a") is state
    assert store.take_decoded("a") is None  # the caller may change it: no longer kept
    assert store.get("a") == b"x"  # the bytes stay the truth


def test_a_job_beyond_the_window_is_not_kept() -> None:
    store = StateStore(None, WINDOW_MS)
    store.advance(0)
    store.put("a", WINDOW_MS * 10, b"x", _state())
    store.put("b", None, b"y", _state())  # nothing to wake for
    assert store.take_decoded("a") is None and store.take_decoded("b") is None


def test_a_job_waiting_for_its_result_is_kept_beyond_the_window() -> None:
    # a fired job wakes at its rescue deadline, past the window; its result usually comes
    # within seconds and then wants the state decoded
    store = StateStore(None, WINDOW_MS)
    store.advance(0)
    state = _state()
    store.put("a", WINDOW_MS * 10, b"x", state, awaited=True)
    store.put("b", None, b"y", _state(1), awaited=True)
    assert store.take_decoded("a") is state
    assert store.take_decoded("b") is not None


def test_a_job_waiting_for_its_result_never_evicts_one_still_to_fire() -> None:
    store = StateStore(None, WINDOW_MS, decoded_limit=2)
    store.advance(0)
    due = [_state(1), _state(2)]
    store.put("a", 1_000, b"x", due[0])
    store.put("b", 1_000, b"y", due[1])
    store.put("c", WINDOW_MS * 10, b"z", _state(3), awaited=True)  # no room: not kept
    assert store.take_decoded("c") is None
    assert store.take_decoded("a") is due[0]  # taken by its fire: room for it again
    fired = _state(4)
    store.put("a", WINDOW_MS * 10, b"x2", fired, awaited=True)
    assert store.take_decoded("b") is due[1] and store.take_decoded("a") is fired


def test_a_rollback_forgets_every_kept_state() -> None:
    store = StateStore(None, WINDOW_MS)
    store.advance(0)
    store.put("a", 1_000, b"x", _state())
    store.commit()
    store.put("b", 1_000, b"y", _state())
    store.rollback()  # the Kafka transaction failed
    assert store.take_decoded("a") is None and store.take_decoded("b") is None
    assert store.get("a") == b"x" and store.get("b") is None


_op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(JOBS), st.one_of(st.none(), st.integers(0, 30_000))),
    st.tuples(st.just("put_awaited"), st.sampled_from(JOBS), st.integers(0, 30_000)),
    st.tuples(st.just("take"), st.sampled_from(JOBS), st.none()),
    st.tuples(st.just("commit"), st.just(""), st.none()),
    st.tuples(st.just("rollback"), st.just(""), st.none()),
)


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(_op, max_size=40),
    limit=st.integers(0, 3),
    room=st.integers(0, 4 * decoded_size(b"v")),
)
def test_what_is_handed_out_is_the_last_written_object_of_that_job(
    ops: list[tuple[str, str, int | None]], limit: int, room: int
) -> None:
    store = StateStore(None, WINDOW_MS, decoded_limit=limit, decoded_bytes=room)
    store.advance(0)
    written: dict[str, SchedulerState] = {}  # the model: the last object written since a rollback
    for n, (op, job, wake) in enumerate(ops):
        if op in ("put", "put_awaited"):
            obj = _state(n)
            store.put(job, wake, b"v", obj, awaited=op == "put_awaited")
            written[job] = obj
        elif op == "take":
            got = store.take_decoded(job)
            assert got is None or got is written.pop(job)
        elif op == "commit":
            store.commit()
        else:
            store.rollback()
            written.clear()
        assert len(store._decoded) <= limit
        assert store._decoded_used == sum(size for _, size in store._decoded.values()) <= room


_byte_op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(JOBS), st.one_of(st.none(), st.integers(0, 3_000))),
    st.tuples(st.just("get"), st.sampled_from(JOBS), st.none()),
    st.tuples(st.just("pop_due"), st.just(""), st.integers(0, 3_000)),
    # a cycle's inputs read ahead: the jobs of a bit mask over JOBS
    st.tuples(st.just("prefetch"), st.just(""), st.integers(0, 2 ** len(JOBS) - 1)),
    st.tuples(st.just("flush"), st.just(""), st.none()),
    st.tuples(st.just("commit"), st.just(""), st.none()),
    st.tuples(st.just("rollback"), st.just(""), st.none()),
)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(_byte_op, max_size=50))
def test_get_returns_the_bytes_last_put_since_the_last_commit_or_rollback(
    ops: list[tuple[str, str, int | None]],
) -> None:
    # puts are written in one statement at a flush or commit, and pop_due and prefetch read
    # jobs' bytes (or their absence) ahead of their fires and inputs: none of it may ever hand
    # out bytes older than the last put, before or after the flush
    store = StateStore(None, WINDOW_MS)
    store.advance(0)
    committed: dict[str, bytes] = {}
    current: dict[str, bytes] = {}
    for n, (op, job, number) in enumerate(ops):
        if op == "put":
            value = f"{job}{n}".encode()
            store.put(job, number, value)
            current[job] = value
        elif op == "get":
            assert store.get(job) == current.get(job)
        elif op == "pop_due":
            assert number is not None
            store.pop_due(number, limit=len(JOBS))
        elif op == "prefetch":
            assert number is not None
            store.prefetch([j for i, j in enumerate(JOBS) if number >> i & 1])
        elif op == "flush":
            store.flush()
        elif op == "commit":
            store.commit()
            committed = dict(current)
        else:
            store.rollback()
            current = dict(committed)
    for job in JOBS:
        assert store.get(job) == current.get(job)


def test_the_due_jobs_states_are_read_together_and_taken_once() -> None:
    store = StateStore(None, WINDOW_MS)
    store.advance(0)
    for job in JOBS:
        store.put(job, 1_000, job.encode())
    store.commit()
    assert sorted(store.pop_due(1_000, limit=10)) == JOBS
    assert set(store._fetched) == set(JOBS)  # one read for all of them
    assert store.get("a") == b"a" and "a" not in store._fetched  # taken
    store.put("b", None, b"b2")  # written after the read: the read bytes are stale
    assert store.get("b") == b"b2"


def test_a_due_jobs_write_of_this_cycle_is_what_get_answers_after_the_flush() -> None:
    # the read ahead of the fires must not take the table's older bytes of a job written in
    # this cycle: they would outlive the flush in the fetched entries
    store = StateStore(None, WINDOW_MS)
    store.advance(0)
    store.put("a", 0, b"old")
    store.commit()
    store.put("a", 0, b"new")
    assert store.pop_due(0, limit=10) == ["a"]
    store.prefetch(["a"])
    store.flush()
    assert store.get("a") == b"new"


def test_a_cycles_inputs_are_read_together_and_a_new_job_is_known_absent() -> None:
    store = StateStore(None, WINDOW_MS)
    store.advance(0)
    store.put("a", None, b"a")
    store.commit()
    store.put("b", None, b"b")  # this cycle's write, not flushed: answered from it
    with patch.object(store, "_db", wraps=store._db) as db:
        store.prefetch(["a", "b", "c"])
        assert db.execute.call_count == 1  # one statement for the batch
        assert (store.get("a"), store.get("b"), store.get("c")) == (b"a", b"b", None)
        assert db.execute.call_count == 1  # and none a job
    store.put("c", None, b"c")  # created since: no longer absent
    assert store.get("c") == b"c"


def test_large_states_are_kept_within_the_memory_bound() -> None:
    big = b"x" * 10_000
    store = StateStore(None, WINDOW_MS, decoded_bytes=2 * decoded_size(big))
    store.advance(0)
    for job in JOBS:
        store.put(job, 1_000, big, _state())
    assert list(store._decoded) == JOBS[-2:]  # the oldest went
    assert store._decoded_used == 2 * decoded_size(big)


@settings(max_examples=100)
@given(
    st.lists(
        st.tuples(st.sampled_from([*JOBS, "e", "f", "g"]), st.none() | st.integers(0, 20_000)),
        max_size=40,
    ),
    st.integers(0, 5_000),
    st.booleans(),
)
def test_the_crowd_counts_follow_the_index(
    puts: list[tuple[str, int | None]], pop_at_ms: int, roll_back: bool
) -> None:
    """The wake-up counts the crowd lead walks (``StateStore.crowd``) always hold the jobs of
    the in-memory index, through puts, pops and a rollback; a crowd pops the jobs waking by
    its instant, but a job put back ``unled`` only at its own time."""
    store = StateStore(None, WINDOW_MS)
    store.advance(0)
    for job_id, wake in puts:
        store.put(job_id, wake, b"x")
    store.commit()
    popped = store.pop_due(pop_at_ms, 1_000)
    if roll_back:
        store.begin()
        store.rollback()
        popped = []
    expected: dict[str, int] = {}
    for job_id, wake in puts:
        expected.pop(job_id, None)
        if wake is not None and wake <= store._loaded_until_ms:
            expected[job_id] = wake
    for job_id in popped:
        del expected[job_id]
    counts = Counter(wake // store_module.CROWD_BUCKET_MS for wake in expected.values())
    assert store._near == expected
    assert store._wake_counts == dict(counts)


def test_a_crowd_pops_early_but_not_what_no_lead_moves() -> None:
    store = StateStore(None, WINDOW_MS)
    store.advance(0)
    for i in range(100):
        store.put(f"j{i}", 1_000, b"x")
    store.put("deadline", 1_000, b"x")
    store.put("later", 5_000, b"x")
    store.commit()
    crowd = store.crowd(0, 50.0, 3_000)  # 101 jobs at 50/s: ~2 s before their wake-up
    assert 1_000 <= crowd.until_ms < 5_000
    due = store.pop_due(0, 1_000, crowd.until_ms)
    assert sorted(due) == sorted([*(f"j{i}" for i in range(100)), "deadline"])
    store.reindex("deadline", 1_000, unled=True)  # e.g. a rescue deadline: not led
    assert store.pop_due(10, 1_000, crowd.until_ms) == []
    assert store.pop_due(1_000, 1_000) == ["deadline"]
    assert store.crowd(0, 1_000_000.0, 3_000).until_ms == 0  # one left, fast: no crowd


def _first_fire_ms(store: StateStore, wake_ms: int, rate: float, cap_ms: int) -> int:
    """The instant the partition's looks (every CROWD_EVERY_MS, or at ``next_ms``) first fire
    the jobs waking at ``wake_ms`` (none popped meanwhile)."""
    t = 0
    while True:
        crowd = store.crowd(t, rate, cap_ms)
        if crowd.until_ms >= wake_ms:
            return t
        later = t + partition_module.CROWD_EVERY_MS
        t = later if crowd.next_ms is None else min(later, crowd.next_ms)


def test_a_crowd_coming_within_the_cap_between_two_looks_is_fired_at_its_turn() -> None:
    """140 jobs at 50/s go out 2.78 s before their wake-up, 220 ms after they come within the
    3 s cap: a look a second apart saw them only after their turn (the 1 s looks at 7,000 and
    8,000 fired them at 8,000, 256 ms late)."""
    store = StateStore(None, 60_000)
    store.advance(0)
    wake = 10_524  # a bucket's last millisecond (the crowd's groups are buckets)
    for i in range(140):
        store.put(f"j{i}", wake, b"x")
    store.commit()
    assert _first_fire_ms(store, wake, 50.0, 3_000) == wake - 139 * 20


@given(
    wakes=st.lists(st.integers(0, 40_000), min_size=1, max_size=300),
    now=st.integers(0, 20_000),
    rate=st.sampled_from([20.0, 100.0, 1_000.0]),
    cap=st.sampled_from([1_000, 3_000, 10_000]),
)
@settings(max_examples=200, deadline=None)
def test_the_crowd_looks_again_before_any_later_groups_turn(
    wakes: list[int], now: int, rate: float, cap: int
) -> None:
    """Whatever the index holds past the cap, the look after ``now`` comes no later than the
    turn of any group not within the cap yet (its jobs waking there and before, at the rate,
    never more than the cap ahead): a crowd is never seen after its turn."""
    store = StateStore(None, 60_000)
    store.advance(0)
    for i, wake in enumerate(wakes):
        store.put(f"j{i}", wake, b"x")
    store.commit()
    crowd = store.crowd(now, rate, cap)
    width = store_module.CROWD_BUCKET_MS
    grouped = Counter(w // width * width + width - 1 for w in wakes)
    for wake in sorted(grouped):
        if wake <= now + cap:
            continue
        seen = sum(n for w, n in grouped.items() if now - store_module.CROWD_LOOKBACK_MS
                   <= w <= wake)  # fmt: skip
        turn = max(wake - (seen - 1) * 1000 / rate, wake - cap)
        assert crowd.next_ms is not None and crowd.next_ms <= math.ceil(turn), (wake, seen)


def test_the_index_counts_the_wake_ups_it_gains() -> None:
    """What the partition's crowd lead watches to look again (``wake_additions``): every job
    the in-memory index gains counts; a pop does not; a rebuild does."""
    store = StateStore(None, WINDOW_MS)
    store.advance(0)
    assert store.wake_additions == 1  # the first load built the index
    before = store.wake_additions
    for i in range(5):
        store.put(f"j{i}", 1_000 + i, b"x")
    store.put("far", WINDOW_MS * 10, b"x")  # beyond the window: not in the index
    assert store.wake_additions == before + 5
    store.commit()
    assert len(store.pop_due(2_000, 10)) == 5
    assert store.wake_additions == before + 5
    store.begin()
    store.rollback()
    assert store.wake_additions > before + 5


_restored = st.lists(
    st.tuples(
        st.sampled_from([*JOBS, "held/a/1/x", "held/b/2/y"]),
        st.one_of(st.none(), st.integers(-5_000, 20_000)),
        st.one_of(st.none(), st.binary(max_size=4)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(before=_restored, rows=_restored, chunk=st.integers(1, 5))
def test_a_restore_keeps_each_jobs_latest_record(
    before: list[tuple[str, int | None, bytes | None]],
    rows: list[tuple[str, int | None, bytes | None]],
    chunk: int,
) -> None:
    # bulk_load writes only each job's latest record (in chunks of LOAD_CHUNK jobs) and builds
    # the wake-up index after: the store ends as if every record had been applied in turn
    store = StateStore(None, WINDOW_MS)
    with patch.object(store_module, "LOAD_CHUNK", chunk):
        assert store.bulk_load(before, now_ms=0) == len(before)
        assert store.bulk_load(rows, now_ms=0) == len(rows)
    model: dict[str, tuple[int | None, bytes]] = {}
    held: dict[str, set[str]] = {}
    for key, wake, value in [*before, *rows]:
        if key.startswith(HELD_PREFIX):
            job = key.split("/")[1]
            if value is None:
                held.get(job, set()).discard(key)
            else:
                held.setdefault(job, set()).add(key)
        elif value is None:
            model.pop(key, None)
        else:
            model[key] = (wake, value)
    for job in JOBS:
        assert store.get(job) == (model[job][1] if job in model else None)
        assert [k for k, _ in store.held_for(job)] == sorted(held.get(job, set()))
    assert store.pending() == sum(1 for wake, _ in model.values() if wake is not None)
    store.advance(0)
    near = [w for w, _ in model.values() if w is not None and w <= WINDOW_MS]
    assert store.next_wake_ms() == (min(near) if near else None)
    assert sorted(store.pop_due(WINDOW_MS, limit=100)) == sorted(
        j for j, (w, _) in model.items() if w is not None and w <= WINDOW_MS
    )


def _contents(store: StateStore) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    store.flush()
    db = store._db
    return (
        sorted(db.execute("SELECT job_id, wake_at_ms, value FROM state")),
        sorted(db.execute("SELECT key, job_id, value FROM held")),
    )


@settings(max_examples=200, deadline=None)
@given(rows=_restored, split=st.integers(0, 30), batches=st.integers(1, 4))
def test_a_standby_copy_and_its_tail_restore_what_the_whole_changelog_does(
    rows: list[tuple[str, int | None, bytes | None]], split: int, batches: int
) -> None:
    # the warm standby (standby.py) writes the changelog into a copy as it comes (``apply``, in
    # batches of whatever one read returned), and a new owner restores the rest onto it
    # (``bulk_load`` on a store that has rows already): the same rows, held commands, wake-ups
    # and near-term index as a restore of everything into an empty store
    whole = StateStore(None, WINDOW_MS)
    whole.bulk_load(rows, now_ms=0)
    copy = StateStore(None, WINDOW_MS)
    head, tail = rows[:split], rows[split:]
    size = max(1, len(head) // batches)
    for i in range(0, len(head), size):
        assert copy.apply(head[i : i + size]) == len(head[i : i + size])
    assert copy.bulk_load(tail, now_ms=0) == len(tail)
    assert _contents(copy) == _contents(whole)
    for job in JOBS:
        assert copy.held_for(job) == whole.held_for(job)
    assert copy.pending() == whole.pending()
    whole.advance(0)
    copy.advance(0)
    assert copy.next_wake_ms() == whole.next_wake_ms()
    assert sorted(copy.pop_due(WINDOW_MS, limit=100)) == sorted(whole.pop_due(WINDOW_MS, limit=100))
