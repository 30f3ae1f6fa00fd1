"""The scheduler's transform with the schedule toolkit: jitter, calendars and backfills, driven
by a ManualClock (no broker: the partition owner's part is the integration tests')."""

from __future__ import annotations

import random
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core.backfill import backfill_execution_id
from duetime.core.clock import ManualClock
from duetime.core.errors import CONTENT_ERRORS
from duetime.core.jobspec import build_job
from duetime.core.models import ControlKind, ResultStatus, Status, Trigger
from duetime.core.records import ControlCommand, CronSchedule, ExecutionResult, SchedulerState
from duetime.core.schedule import jitter_ms
from duetime.schedulers import logic
from duetime.schemas.codec import Codec

JOB = "5a8a3c1e-2222-4c1e-9a63-6a0d7e1f2b10"
MINUTE = 60_000
T0 = int(datetime(2026, 12, 21, 8, 0, tzinfo=UTC).timestamp() * 1000)  # a Monday
POLICY = logic.Policy()


def state_of(
    schedule: dict[str, Any], overlap: str = "allow", *, now_ms: int = T0
) -> SchedulerState:
    definition = build_job(
        {
            "job_id": JOB,
            "name": "toolkit",
            "schedule": schedule,
            "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
            "overlap": overlap,
            "misfire": "skip",
        },
        now_ms=now_ms,
    )
    state, _ = logic.on_definition(None, definition, now_ms)
    return state


def finish(state: SchedulerState, execution_id: str, now_ms: int) -> logic.Outputs:
    entry = next(e for e in state.inflight if e.execution_id == execution_id)
    res = ExecutionResult(
        execution_id=execution_id,
        job_id=JOB,
        attempt=entry.attempt,
        status=ResultStatus.SUCCESS,
        worker_id="w",
        lease_token=1,
        scheduled_at_ms=entry.scheduled_at_ms,
        finished_at_ms=now_ms,
        priority=state.definition.priority,
    )
    _, out = logic.on_result(state, res, now_ms, random.Random(0))
    return out


def run_timer(state: SchedulerState, clock: ManualClock, until_ms: int) -> list[logic.Outputs]:
    """Advance the clock to each wake-up until ``until_ms``, firing what is due (and ending
    every execution at once, so overlap never holds one back)."""
    outs = []
    while (wake := logic.wake_at_ms(state)) is not None and wake <= until_ms:
        clock.set(max(clock.now_ms(), wake))
        out = logic.fire_due(state, clock.now_ms(), POLICY, owned_since_ms=T0)
        outs.append(out)
        for request in out.executions:
            finish(state, request.execution_id, clock.now_ms())
    return outs


# --------------------------------------------------------------------------------- jitter


@settings(max_examples=30, deadline=None)
@given(jitter_s=st.integers(1, 50))
def test_a_jittered_job_fires_at_its_offset_and_keeps_the_nominal_identity(jitter_s: int) -> None:
    """Each run's due time is its nominal occurrence + jitter_ms; scheduled_at and the
    execution id are the nominal occurrence's, so another scheduler derives the same."""
    clock = ManualClock(T0)
    state = state_of({"cron": "* * * * *", "jitter_s": jitter_s})
    outs = run_timer(state, clock, T0 + 10 * MINUTE)
    requests = [r for out in outs for r in out.executions]
    assert len(requests) == 10
    for r in requests:
        assert r.scheduled_at_ms % MINUTE == 0
        assert r.due_at_ms == r.scheduled_at_ms + jitter_ms(JOB, r.scheduled_at_ms, jitter_s)
        assert r.execution_id == logic.execution_id_for(JOB, r.scheduled_at_ms, Trigger.SCHEDULE)
        assert r.emitted_at_ms == r.due_at_ms  # fired at its jittered time, not before


def test_the_wake_up_includes_the_jitter_and_survives_a_restore() -> None:
    state = state_of({"cron": "0 9 * * *", "timezone": "Europe/Berlin", "jitter_s": 3600})
    nominal = state.next_run_at_ms
    assert nominal is not None
    wake = logic.wake_at_ms(state)
    assert wake == nominal + jitter_ms(JOB, nominal, 3600)
    assert logic.fire_due(state, wake - 1, POLICY).executions == []  # not a ms early
    codec = Codec()
    restored = codec.load(SchedulerState, codec.dump(state))  # another scheduler's copy
    assert logic.wake_at_ms(restored) == wake
    assert [r.execution_id for r in logic.fire_due(restored, wake, POLICY).executions] == [
        r.execution_id for r in logic.fire_due(state, wake, POLICY).executions
    ]


def test_a_late_jittered_occurrence_is_still_judged_a_misfire_from_its_fire_time() -> None:
    """Handled within the misfire threshold of its JITTERED time: it fires (misfire=skip
    would drop it if the nominal time counted)."""
    state = state_of({"cron": "0 9 * * *", "jitter_s": 3600})
    nominal = state.next_run_at_ms
    assert nominal is not None
    fire = logic.wake_at_ms(state)
    assert fire is not None
    out = logic.fire_due(state, fire + POLICY.misfire_threshold_ms - 1, POLICY, owned_since_ms=T0)
    assert [r.scheduled_at_ms for r in out.executions] == [nominal]


# ------------------------------------------------------------------------------ calendars

CALENDAR = {
    "name": "holidays",
    "timezone": "Europe/Berlin",
    "exclude": ["2026-12-24..2026-12-31"],
    "exclude_weekdays": ["sat", "sun"],
}


def test_excluded_occurrences_are_skipped_and_recorded() -> None:
    clock = ManualClock(T0)
    state = state_of({"cron": "0 9 * * *", "timezone": "Europe/Berlin", "calendar": CALENDAR})
    outs = run_timer(state, clock, T0 + 16 * 24 * 3600_000)  # 17 days: to Wednesday 6 January
    ran = [
        datetime.fromtimestamp(r.scheduled_at_ms / 1000, UTC).date().isoformat()
        for out in outs
        for r in out.executions
    ]
    assert ran == [
        "2026-12-21",
        "2026-12-22",
        "2026-12-23",
        "2027-01-01",
        "2027-01-04",
        "2027-01-05",
        "2027-01-06",
    ]
    skips = [s for out in outs for s in out.skips]
    assert {s.reason for s in skips} == {"calendar"}
    assert len(skips) == 17 - len(ran)  # every other day of the 17 was recorded as skipped
    assert state.status is Status.SUCCESS  # a skipped day leaves the job as its last run did


def test_overlap_skips_are_recorded_too() -> None:
    clock = ManualClock(T0)
    state = state_of({"cron": "* * * * *"}, overlap="skip")
    clock.set(logic.wake_at_ms(state) or 0)
    assert len(logic.fire_due(state, clock.now_ms(), POLICY).executions) == 1
    clock.set(logic.wake_at_ms(state) or 0)  # the first run is still going
    out = logic.fire_due(state, clock.now_ms(), POLICY)
    assert out.executions == [] and [s.reason for s in out.skips] == ["overlap"]


def test_a_bad_calendar_written_past_the_api_is_refused_as_input() -> None:
    state = state_of({"cron": "0 9 * * *", "calendar": CALENDAR})
    schedule = state.definition.schedule
    assert isinstance(schedule, CronSchedule) and schedule.calendar is not None
    bad = replace(schedule, calendar=replace(schedule.calendar, timezone="Nowhere/Land"))
    definition = replace(state.definition, schedule=bad)
    try:
        logic.check_input(definition)
    except CONTENT_ERRORS as exc:  # the partition parks it on the poison topic
        assert "Nowhere/Land" in str(exc)
    else:
        raise AssertionError("a calendar with an unknown zone was accepted")


# ------------------------------------------------------------------------------ backfills


def backfill(from_ms: int, to_ms: int, now_ms: int) -> ControlCommand:
    return ControlCommand(
        command_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{from_ms}/{to_ms}")),
        job_id=JOB,
        kind=ControlKind.BACKFILL,
        issued_at_ms=now_ms,
        backfill_from_ms=from_ms,
        backfill_to_ms=to_ms,
    )


def apply(state: SchedulerState, command: ControlCommand, now_ms: int) -> logic.Outputs:
    _, out = logic.on_control(state, command, now_ms, POLICY)
    return out


def drain(state: SchedulerState, first: logic.Outputs, now_ms: int) -> list[int]:
    """End every backfill execution as it comes; the occurrences run, in order."""
    ran: list[int] = []
    pending = list(first.executions)
    while pending:
        request = pending.pop(0)
        assert request.trigger is Trigger.BACKFILL
        ran.append(request.scheduled_at_ms)
        pending += finish(state, request.execution_id, now_ms).executions
    return ran


def test_a_backfill_runs_each_occurrence_of_the_range_once_in_order() -> None:
    now = T0 + 3600_000
    state = state_of({"cron": "*/10 * * * *"}, overlap="skip", now_ms=now)
    command = backfill(T0 - 24 * 3600_000, T0 - 23 * 3600_000, now)  # 7 occurrences
    out = apply(state, command, now)
    assert len(out.executions) == 1  # overlap=skip: one at a time
    ran = drain(state, out, now)
    assert ran == [T0 - 24 * 3600_000 + i * 10 * MINUTE for i in range(7)]
    (progress,) = state.backfills
    assert (progress.emitted, progress.skipped, progress.after_ms) == (7, 0, progress.to_ms)
    assert apply(state, command, now + 1).executions == []  # a repeated command: nothing


def test_an_allow_job_backfills_several_at_once_and_the_ids_are_stable() -> None:
    now = T0
    state = state_of({"cron": "* * * * *"}, overlap="allow", now_ms=now)
    command = backfill(T0 - 30 * MINUTE, T0 - 1, now)
    out = apply(state, command, now)
    assert len(out.executions) == logic.BACKFILL_PARALLEL
    ids = [r.execution_id for r in out.executions]
    assert ids == [
        backfill_execution_id(command.command_id, r.scheduled_at_ms) for r in out.executions
    ]
    codec = Codec()  # a failover: the new owner restores the state and reads the command again
    restored = codec.load(SchedulerState, codec.dump(state))
    assert apply(restored, command, now + 5).executions == []
    assert len(drain(restored, out, now + 10)) == 30


def test_a_backfill_skips_calendar_days_and_counts_them() -> None:
    now = T0
    state = state_of(
        {"cron": "0 9 * * *", "timezone": "Europe/Berlin", "calendar": CALENDAR}, now_ms=now
    )
    day = 24 * 3600_000
    out = apply(state, backfill(T0 - 14 * day, T0 - 1, now), now)  # 7 to 20 December
    ran = drain(state, out, now)
    assert len(ran) == 10  # two weeks, weekends excluded
    (progress,) = state.backfills
    assert (progress.emitted, progress.skipped) == (10, 4)


def test_a_paused_job_holds_its_backfill_and_a_cancel_drops_it() -> None:
    now = T0
    state = state_of({"cron": "* * * * *"}, overlap="skip", now_ms=now)
    pause = ControlCommand(command_id="p", job_id=JOB, kind=ControlKind.PAUSE, issued_at_ms=now)
    apply(state, pause, now)
    assert apply(state, backfill(T0 - 5 * MINUTE, T0 - 1, now), now).executions == []
    resume = replace(pause, command_id="r", kind=ControlKind.RESUME)
    out = apply(state, resume, now + 1)
    assert [r.trigger for r in out.executions] == [Trigger.BACKFILL]
    cancel = replace(pause, command_id="c", kind=ControlKind.CANCEL)
    apply(state, cancel, now + 2)
    assert finish(state, out.executions[0].execution_id, now + 3).executions == []
    assert all(b.after_ms == b.to_ms for b in state.backfills)


def test_a_backfill_of_a_range_with_no_occurrence_finishes_at_once() -> None:
    state = state_of({"cron": "0 9 * * *", "end_at": "2026-01-01T00:00:00Z"}, now_ms=T0)
    out = apply(state, backfill(T0 - 5 * 24 * 3600_000, T0, T0), T0)
    assert out.executions == []
    assert [(b.emitted, b.after_ms == b.to_ms) for b in state.backfills] == [(0, True)]


def test_a_backfill_command_without_a_range_is_refused_as_input() -> None:
    state = state_of({"cron": "* * * * *"})
    bad = replace(backfill(T0, T0, T0), backfill_to_ms=None)
    try:
        logic.check_input(bad)
    except ValueError as exc:
        assert "not a range" in str(exc)
    else:
        raise AssertionError("a backfill without its end was accepted")
    _, out = logic.on_control(state, bad, T0, POLICY)  # and past the check, it does nothing
    assert out.executions == [] and state.backfills == []


# --------------------------------------------------------------------------------- bounds


def test_a_cron_job_runs_within_its_bounds_then_ends_cleanly() -> None:
    """From start_at to end_at and no further: after the last occurrence ended the job has no
    next run and no wake-up (nothing left to fire), and a PATCH moving end_at into the past
    leaves it the same."""
    clock = ManualClock(T0)
    start, end = "2026-12-21T08:10:00Z", "2026-12-21T08:40:00Z"
    state = state_of({"cron": "*/10 * * * *", "start_at": start, "end_at": end})
    outs = run_timer(state, clock, T0 + 24 * 3600_000)
    ran = [r.scheduled_at_ms for out in outs for r in out.executions]
    assert ran == [T0 + m * MINUTE for m in (10, 20, 30, 40)]
    assert state.next_run_at_ms is None and logic.wake_at_ms(state) is None
    assert state.status is Status.SUCCESS and state.inflight == []

    late = state_of({"cron": "*/10 * * * *", "end_at": "2026-01-01T00:00:00Z"})
    assert late.next_run_at_ms is None and logic.wake_at_ms(late) is None

    live = state_of({"cron": "*/10 * * * *"})
    cron = live.definition.schedule
    assert live.next_run_at_ms is not None and isinstance(cron, CronSchedule)
    ended = replace(
        live.definition,
        revision=live.definition.revision + 1,
        schedule=replace(cron, end_at_ms=T0 - MINUTE),
    )
    logic.on_definition(live, ended, T0 + 1)  # a PATCH moving end_at into the past
    assert live.next_run_at_ms is None and logic.wake_at_ms(live) is None
