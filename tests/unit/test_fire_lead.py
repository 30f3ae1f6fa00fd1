"""The scheduler's fire lead (``Policy.fire_lead_ms``, DUETIME_SCHEDULER_FIRE_LEAD_MS).

Runs and retries are emitted up to the lead before their due time and carry that due time
(the worker holds them until then); rescue deadlines are not led; an occurrence whose job has
a live execution under overlap ``skip`` / ``queue_one`` is judged at its due time, as without
a lead. Pure logic: the timer is simulated with ``wake_at_ms``.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core.jobspec import build_job
from duetime.core.models import ResultStatus, Status, Trigger
from duetime.core.records import ExecutionRequest, SchedulerState
from duetime.schedulers import logic
from tests.unit.test_scheduler_logic import NOW, result

SECOND = 1_000  # NOW (test_scheduler_logic's) is a whole second


def every_second(overlap: str) -> SchedulerState:
    definition = build_job(
        {
            "name": "tick",
            "schedule": {"cron": "* * * * * *"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
            "overlap": overlap,
        },
        now_ms=NOW,
    )
    state, _ = logic.on_definition(None, definition, NOW)
    return state


def run_timer(
    state: SchedulerState, policy: logic.Policy, start_ms: int, steps: list[int]
) -> tuple[list[ExecutionRequest], int]:
    """Advance the clock by ``steps``; at each reading fire while the job's wake-up (with the
    policy's lead) has come, as the partition's timer does. Returns the requests and the end."""
    now = start_ms
    emitted: list[ExecutionRequest] = []
    for step in steps:
        now += step
        for _ in range(1_000):
            wake = logic.wake_at_ms(state, policy.fire_lead_ms)
            if wake is None or wake > now:
                break
            out = logic.fire_due(state, now, policy)
            assert out.state_changed, "woken for nothing: the timer would spin"
            emitted += out.executions
        else:
            raise AssertionError("the timer never caught up")
    return emitted, now


@settings(max_examples=200)
@given(
    lead_ms=st.integers(min_value=0, max_value=5_000),
    steps=st.lists(st.integers(min_value=1, max_value=3_000), min_size=1, max_size=20),
)
def test_every_occurrence_once_never_before_its_lead(lead_ms: int, steps: list[int]) -> None:
    state = every_second("allow")
    first = state.next_run_at_ms
    assert first is not None and first % SECOND == 0
    policy = logic.Policy(fire_lead_ms=lead_ms)
    emitted, end = run_timer(state, policy, NOW, steps)
    scheduled = [r.scheduled_at_ms for r in emitted]
    # exactly the cron's seconds up to the end + the lead: none missed, none twice
    last = (end + lead_ms) // SECOND * SECOND
    assert scheduled == list(range(first, last + 1, SECOND))
    for r in emitted:
        assert r.trigger is Trigger.SCHEDULE and r.due_at_ms == r.scheduled_at_ms
        assert r.emitted_at_ms >= r.due_at_ms - lead_ms  # never further ahead than the lead
    # a live execution's rescue deadline counts from its due time when it was emitted ahead
    window = policy.rescue_window_ms(state.definition)
    by_id = {r.execution_id: r for r in emitted}
    for e in state.inflight:
        r = by_id[e.execution_id]
        assert e.deadline_ms == max(r.emitted_at_ms, r.due_at_ms) + window


@settings(max_examples=100)
@given(
    overlap=st.sampled_from(["skip", "queue_one"]),
    lead_ms=st.integers(min_value=1, max_value=5_000),
    steps=st.lists(st.integers(min_value=1, max_value=3_000), min_size=1, max_size=12),
)
def test_an_overlap_policy_judges_at_the_due_time(
    overlap: str, lead_ms: int, steps: list[int]
) -> None:
    """With the first run still live, no later occurrence is emitted, skipped or queued
    before its due time: the overlap policy sees what it would see without a lead."""
    state = every_second(overlap)
    policy = logic.Policy(fire_lead_ms=lead_ms)
    due = state.next_run_at_ms
    assert due is not None
    first, now = run_timer(state, policy, due - lead_ms, [0])
    assert [r.scheduled_at_ms for r in first] == [due]  # led: nothing was live
    for step in steps:
        now += step
        for _ in range(1_000):
            wake = logic.wake_at_ms(state, lead_ms)
            if wake is None or wake > now:
                break
            judged = state.next_run_at_ms
            assert judged is not None and judged <= now  # due, not led
            out = logic.fire_due(state, now, policy)
            assert out.executions == []  # skipped or queued behind the live run
            assert out.state_changed


def test_a_retry_is_emitted_its_lead_ahead_and_carries_its_due_time() -> None:
    lead_ms = 500
    policy = logic.Policy(fire_lead_ms=lead_ms)
    definition = build_job(
        {
            "name": "flaky",
            "schedule": {"at": "2020-01-01T00:00:00Z"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
            "retry": {"max_retries": 2, "base_delay_s": 2, "jitter": False},
        },
        now_ms=NOW,
    )
    state, _ = logic.on_definition(None, definition, NOW)
    [request] = logic.fire_due(state, NOW, policy).executions
    failed = result(request, ResultStatus.FAILURE)
    new, _ = logic.on_result(state, failed, NOW + 10, random.Random(0), policy)
    assert new is not None
    [waiting] = new.inflight
    assert waiting.status is Status.FAILED
    due = waiting.due_at_ms
    assert logic.wake_at_ms(new, lead_ms) == due - lead_ms
    assert logic.fire_due(new, due - lead_ms - 1, policy).executions == []
    [retry] = logic.fire_due(new, due - lead_ms, policy).executions
    assert retry.attempt == 2 and retry.trigger is Trigger.RETRY
    assert retry.due_at_ms == due and retry.emitted_at_ms == due - lead_ms
    # its rescue deadline counts from the due time
    assert new.inflight[0].deadline_ms == due + policy.rescue_window_ms(new.definition)
    # a rescue deadline is not led: the job wakes at it, not the lead before it
    assert logic.wake_at_ms(new, lead_ms) == new.inflight[0].deadline_ms


@settings(max_examples=100)
@given(
    overlap=st.sampled_from(["allow", "skip", "queue_one"]),
    lead_ms=st.integers(min_value=0, max_value=2_000),
    extra_ms=st.integers(min_value=1, max_value=5_000),
    steps=st.lists(st.integers(min_value=1, max_value=3_000), min_size=1, max_size=12),
)
def test_a_crowds_extra_lead_moves_runs_only(
    overlap: str, lead_ms: int, extra_ms: int, steps: list[int]
) -> None:
    """The crowd lead as the partition applies it: a job popped ``extra_ms`` before its
    wake-up fires only when a lead moves that wake-up (``led_wake_ms``), with the larger
    lead; each occurrence once, never further ahead than lead + extra, a rescue deadline
    never early and an occurrence that overlap skip / queue_one judges never before its time."""
    state = every_second(overlap)
    base = logic.Policy(fire_lead_ms=lead_ms)
    crowd = logic.Policy(fire_lead_ms=lead_ms + extra_ms)
    now = NOW
    emitted: list[ExecutionRequest] = []
    for step in steps:
        now += step
        for _ in range(1_000):
            wake = logic.wake_at_ms(state, lead_ms)
            led = logic.led_wake_ms(state, lead_ms)
            if wake is None or (wake > now and (led is None or led > now + extra_ms)):
                break
            before = [(e.execution_id, e.deadline_ms, e.rescues) for e in state.inflight]
            out = logic.fire_due(state, now, crowd if wake > now else base)
            assert out.state_changed, "woken for nothing: the timer would spin"
            assert not out.rescues or wake <= now  # a deadline is never led
            for request in out.executions:
                assert request.emitted_at_ms >= request.due_at_ms - lead_ms - extra_ms
                if overlap != "allow" and len(before) > 0:
                    assert request.due_at_ms <= now  # judged at its time
            emitted += out.executions
        else:
            raise AssertionError("the timer never caught up")
    scheduled = [r.scheduled_at_ms for r in emitted if r.trigger is Trigger.SCHEDULE]
    assert len(scheduled) == len(set(scheduled))
