"""Fairness keys (issue 18, item 4): the workers' weighted round robin (FairQueue, hypothesis
properties), the job field's validation, the scheduler's hold and release (pure transform) and
the partition's gate (credit per key, transactions, the restore header)."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core.errors import ValidationError
from duetime.core.jobspec import build_job, job_to_api
from duetime.core.models import ControlKind, ResultStatus, Status, Trigger
from duetime.core.priority import FairQueue, Waiting
from duetime.core.records import (
    ControlCommand,
    Fairness,
    JobDefinition,
    SchedulerState,
)
from duetime.schedulers import logic
from duetime.schedulers.fairness import FairnessGate, Share, share_of
from duetime.schemas.codec import Codec
from tests.unit.test_scheduler_logic import result

NOW = 1_800_000_000_000

# --- the workers' round robin (duetime.core.priority.FairQueue) -----------------------------

keys = st.sampled_from(["a", "b", "c", "d", "e", None])
weights = st.integers(1, 100)


def drain(queue: FairQueue) -> list[Waiting]:
    out = []
    while queue:
        assert queue[0] is queue[0]  # the head is stable until popped
        head = queue[0]
        assert queue.popleft() is head
        out.append(head)
    return out


@given(st.lists(keys, max_size=200))
def test_order_within_a_key_is_fifo(pushed: list[str | None]) -> None:
    queue = FairQueue()
    for i, key in enumerate(pushed):
        queue.append(Waiting(float(i), f"#{i}", key))
    assert len(queue) == len(pushed)
    popped = drain(queue)
    assert sorted(w.key for w in popped) == sorted(f"#{i}" for i in range(len(pushed)))
    for key in set(pushed):
        mine = [w.enqueued_at for w in popped if w.fairness_key == key]
        assert mine == sorted(mine)


@settings(deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 20), min_size=2), st.integers(1, 20)
)
def test_shares_follow_the_weights_while_every_key_waits(
    weight_of: dict[str, int], backlog: int
) -> None:
    """While every key still has work, key k has had count_k / w_k turns within one turn of
    every other key's count / weight (stride scheduling's bound)."""
    queue = FairQueue()
    total = max(weight_of.values()) * backlog
    for i in range(total):
        for key, weight in weight_of.items():
            queue.append(Waiting(float(i), f"{key}{i}", key, weight))
    counts: Counter[str] = Counter()
    while all(counts[k] < total for k in weight_of):
        counts[queue.popleft().fairness_key or ""] += 1
        normalised = [counts[k] / w for k, w in weight_of.items()]
        assert max(normalised) - min(normalised) <= 1.0


@given(
    st.lists(st.tuples(st.sampled_from("abcde"), weights), min_size=1, max_size=300),
    st.integers(0, 300),
    weights,
)
def test_a_new_key_is_served_within_one_round_of_the_waiting_keys(
    backlog: list[tuple[str, int]], popped_first: int, weight: int
) -> None:
    """However large the other keys' backlogs, a key that starts waiting is served before
    any waiting key gets a second turn: within (number of keys waiting) starts."""
    queue = FairQueue()
    for i, (key, w) in enumerate(backlog):
        queue.append(Waiting(float(i), f"{key}{i}", key, w))
    for _ in range(min(popped_first, len(backlog) - 1)):
        queue.popleft()
    waiting_keys = {w.fairness_key for w in queue}
    queue.append(Waiting(1e9, "new", "tenant-b", weight))
    starts = 0
    while True:
        starts += 1
        if queue.popleft().key == "new":
            break
    assert starts <= len(waiting_keys) + 1


@given(st.lists(st.tuples(keys, weights), max_size=100), st.lists(st.booleans(), max_size=100))
def test_no_key_starves_and_nothing_is_lost(
    pushed: list[tuple[str | None, int]], lefts: list[bool]
) -> None:
    """Mixed appends and head returns (appendleft): every execution comes out exactly once,
    and one put back at the head comes out next."""
    queue = FairQueue()
    for i, (key, weight) in enumerate(pushed):
        queue.append(Waiting(float(i), f"#{i}", key, weight))
    out: list[str] = []
    for back in lefts:
        if not queue:
            break
        head = queue.popleft()
        if back:
            queue.appendleft(head)
            assert queue[0] is head
        else:
            out.append(head.key)
    out += [w.key for w in drain(queue)]
    assert sorted(out) == sorted(f"#{i}" for i in range(len(pushed)))


def test_without_keys_the_queue_is_plain_fifo_and_iterates_everything() -> None:
    queue = FairQueue(Waiting(float(i), f"#{i}") for i in range(5))
    queue.appendleft(Waiting(-1.0, "back"))
    assert [w.key for w in queue] == ["back", "#0", "#1", "#2", "#3", "#4"]
    assert [w.key for w in drain(queue)] == ["back", "#0", "#1", "#2", "#3", "#4"]
    with pytest.raises(IndexError):
        queue.popleft()
    with pytest.raises(IndexError):
        queue[0]


def test_a_weight_of_three_gets_three_turns_for_one() -> None:
    queue = FairQueue()
    for i in range(30):
        queue.append(Waiting(float(i), f"a{i}", "a", 3))
        queue.append(Waiting(float(i), f"b{i}", "b", 1))
    first = [queue.popleft().fairness_key for _ in range(20)]
    assert first.count("a") == 15 and first.count("b") == 5


def test_a_hostile_weight_is_clamped() -> None:
    queue = FairQueue()
    for i in range(4):
        queue.append(Waiting(float(i), f"a{i}", "a", 0))
        queue.append(Waiting(float(i), f"b{i}", "b", 10**9))
    assert len(drain(queue)) == 8


# --- the job field ----------------------------------------------------------------------


def job(**fields: Any) -> JobDefinition:
    body = {
        "name": "fair",
        "schedule": {"at": "2020-01-01T00:00:00Z"},
        "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
        "payload": {"tenant": "acme"},
        "retry": {"max_retries": 2, "base_delay_s": 1, "jitter": False},
        **fields,
    }
    return build_job(body, now_ms=NOW)


def test_the_field_is_checked_and_defaults_its_weight() -> None:
    definition = job(fairness={"key": "t-{payload.tenant}"})
    assert definition.fairness is not None and definition.fairness.weight == 1
    assert job_to_api(definition)["fairness"] == {"key": "t-{payload.tenant}", "weight": 1}
    assert job(fairness=None).fairness is None
    codec = Codec()
    again = codec.load(JobDefinition, codec.dump(job(fairness={"key": "x", "weight": 7})))
    assert again.fairness is not None and again.fairness.weight == 7


@pytest.mark.parametrize(
    ("fairness", "field"),
    [
        ({"key": "{payload.nope}"}, "fairness.key"),
        ({"key": ""}, "fairness.key"),
        ({"key": "x", "weight": 0}, "fairness.weight"),
        ({"key": "x", "weight": 101}, "fairness.weight"),
        ({"key": "x", "weight": 1.5}, "fairness.weight"),
        ({"key": "x", "weight": True}, "fairness.weight"),
        ({"key": "x", "other": 1}, "fairness"),
        ({"weight": 2}, "fairness"),
        ("tenant", "fairness"),
    ],
)
def test_a_bad_fairness_is_refused_naming_the_field(fairness: Any, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        job(fairness=fairness)
    assert err.value.field == field


# --- the scheduler's hold and release (pure) --------------------------------------------


def fair_state(tenant: str = "acme", weight: int = 1) -> SchedulerState:
    definition = job(
        fairness={"key": "{payload.tenant}", "weight": weight}, payload={"tenant": tenant}
    )
    state, _ = logic.on_definition(None, definition, NOW)
    assert state is not None
    return state


def test_a_due_execution_is_held_then_released_with_its_key() -> None:
    state = fair_state()
    out = logic.fire_due(state, NOW, logic.Policy())
    assert out.executions == [] and out.state_changed
    entry = state.inflight[0]
    assert entry.held and entry.fairness_key == "acme" and entry.deadline_ms is None
    assert state.status is Status.QUEUED
    assert logic.wake_at_ms(state) is None  # the gate releases it, not the timer
    share = share_of(state)
    assert share == Share({}, {"acme": entry.due_at_ms}, 1, state.definition.priority.rank, 1)

    out = logic.release_held(state, "acme", NOW + 5, logic.Policy())
    [request] = out.executions
    assert request.fairness_key == "acme" and request.fairness_weight == 1
    assert request.trigger is Trigger.SCHEDULE and request.due_at_ms == entry.due_at_ms
    assert not entry.held and entry.deadline_ms is not None
    assert share_of(state) == Share({"acme": 1}, {}, 0, state.definition.priority.rank, 1)
    assert logic.release_held(state, "acme", NOW + 6).executions == []  # nothing held left

    # a failure's retry is held again, then released as a retry
    new, _ = logic.on_result(
        state, result(request, ResultStatus.FAILURE, token=1), NOW + 10, random.Random(1)
    )
    assert new is not None and share_of(new) is None  # failed, waiting: not in flight
    out = logic.fire_due(new, NOW + 10_000, logic.Policy())
    assert out.executions == [] and new.inflight[0].held and new.inflight[0].attempt == 2
    [retry] = logic.release_held(new, "acme", NOW + 10_001).executions
    assert retry.trigger is Trigger.RETRY and retry.attempt == 2


def test_a_report_of_a_held_attempt_and_a_cancel() -> None:
    state = fair_state()
    logic.fire_due(state, NOW, logic.Policy())
    entry = state.inflight[0]
    forged = result(logic.execution_request(state, entry, NOW), ResultStatus.SUCCESS, token=99)
    _, out = logic.on_result(state, forged, NOW + 1, random.Random(0))
    assert not out.state_changed and entry.held  # never emitted: nothing to report
    cancel = logic.on_control(state, _command(state, "cancel"), NOW + 2, logic.Policy())[0]
    assert cancel is not None and cancel.inflight == [] and share_of(cancel) is None


def _command(state: SchedulerState, kind: str) -> ControlCommand:
    return ControlCommand(
        command_id="00000000-0000-4000-8000-000000000001",
        job_id=state.job_id,
        kind=ControlKind(kind),
        issued_at_ms=NOW,
    )


def test_jobs_without_fairness_are_never_held() -> None:
    definition = job()
    state, _ = logic.on_definition(None, definition, NOW)
    assert state is not None
    [request] = logic.fire_due(state, NOW, logic.Policy()).executions
    assert request.fairness_key is None and share_of(state) is None


def test_a_definition_whose_key_does_not_resolve_is_refused() -> None:
    definition = job(fairness={"key": "{payload.tenant}"})
    bad = dataclasses.replace(definition, payload_json="{}")  # written past the API
    with pytest.raises(ValueError, match=r"fairness\.key"):
        logic.check_input(bad)


# --- the partition's gate ----------------------------------------------------------------


def share(live: int = 0, held_due: int | None = None, key: str = "a", weight: int = 1) -> Share:
    return Share(
        {key: live} if live else {},
        {} if held_due is None else {key: held_due},
        0 if held_due is None else 1,
        2,
        weight,
    )


def test_the_gate_releases_per_key_up_to_its_cap_in_due_order() -> None:
    gate = FairnessGate(cap=2)
    gate.set("j1", share(live=2))
    gate.set("h3", share(held_due=30))
    gate.set("h1", share(held_due=10))
    gate.set("b", share(held_due=50, key="b"))
    gate.commit()
    assert gate.held == 3
    # key a is at its cap: only b (no credit used) goes
    released = []
    for job_id, key in gate.releasable():
        released.append(job_id)
        gate.set(job_id, share(live=1, key=key))
    assert released == ["b"]
    gate.set("j1", share(live=1))  # a result freed one of a's
    released = []
    for job_id, key in gate.releasable():
        released.append(job_id)
        gate.set(job_id, share(live=1, key=key))
    assert released == ["h1"]  # the earlier due time first, then a is full again
    assert gate.inflight("a") == 2 and gate.held == 1
    gate.rollback()  # the transaction failed: back to the committed credit and holds
    assert gate.inflight("a") == 2 and gate.held == 3 and gate.inflight("b") == 0


def test_a_weight_multiplies_the_cap() -> None:
    gate = FairnessGate(cap=2)
    for i in range(10):
        gate.set(f"h{i}", share(held_due=i, weight=3))
    released = []
    for job_id, key in gate.releasable():
        released.append(job_id)
        gate.set(job_id, share(live=1, key=key, weight=3))
    assert released == [f"h{i}" for i in range(6)]


def test_a_share_survives_its_header_and_a_bad_header_is_refused() -> None:
    s = Share({"a": 2}, {"b": 5}, 3, 1, 4)
    assert Share.decode(s.encode()) == s
    for raw in (b"", b"{}", b"[]", b'{"l":{"a":0},"h":{},"n":0,"r":1,"w":1}', b"\xff"):
        with pytest.raises(ValueError):
            Share.decode(raw)


@settings(max_examples=60)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 3), st.booleans()), max_size=40))
def test_the_gate_counts_are_the_sum_of_the_shares(ops: list[tuple[str, int, bool]]) -> None:
    """Whatever the order of changes, commits and rollbacks: the credit per key equals the sum
    of the committed (or staged) shares, as a restore would rebuild it."""
    gate = FairnessGate(cap=1)
    committed: dict[str, Share] = {}
    staged: dict[str, Share] = {}
    for i, (key, live, commit) in enumerate(ops):
        job_id = f"j{i % 5}"
        s = share(live=live, held_due=i if live == 0 else None, key=key)
        gate.set(job_id, s)
        staged[job_id] = s
        if commit:
            gate.commit()
            committed.update(staged)
            staged.clear()
        elif i % 7 == 0:
            gate.rollback()
            staged.clear()
    gate.rollback()
    fresh = FairnessGate(cap=1)
    fresh.load(committed)
    for key in "abc":
        assert gate.inflight(key) == fresh.inflight(key)
    assert gate.held == fresh.held


# --- the CLI's flags ---------------------------------------------------------------------


def test_cli_fairness_flags_make_the_field_and_leave_it_out_when_not_given() -> None:
    import argparse

    from duetime.producers.cli.commands import _create_body, add_jobs_arguments

    parser = argparse.ArgumentParser()
    add_jobs_arguments(parser)
    base = ["create", "--name", "x", "--url-target", "https://example.com/hook"]
    body = _create_body(
        parser.parse_args([*base, "--fairness-key", "t-{payload.t}", "--fairness-weight", "3"])
    )
    assert body["fairness"] == {"key": "t-{payload.t}", "weight": 3}
    only_key = _create_body(parser.parse_args([*base, "--fairness-key", "acme"]))
    assert build_job(only_key, now_ms=NOW).fairness == Fairness(key="acme", weight=1)
    assert "fairness" not in _create_body(parser.parse_args(base))
