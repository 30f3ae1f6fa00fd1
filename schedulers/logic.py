"""The scheduler's transform: pure functions from (job state, input event, now) to a new state
and the records to emit.

No clock, no randomness, no I/O: the caller passes ``now_ms`` and a ``random.Random``. The
partition owner applies the outputs in one Kafka transaction together with the consumed
offsets, so every state change and every execution request happen exactly once.

State is a :class:`SchedulerState` record, edited in place. ``inflight`` lists the executions
of the job that are queued, running, or failed and waiting for their retry; a job's wake-up
time (``wake_at_ms``) is the earliest of its next scheduled run, its retries and the rescue
deadlines of its live executions. Every change of the job's status goes through
:func:`duetime.core.states.transition`.

The rescuer (issue 14, item 2): a queued or running execution whose result does not come by its
``deadline_ms`` is re-emitted as it was (same execution id, attempt and trigger); the worker's
fenced lease decides what the copy does (a live holder keeps the lease and the copy is dropped,
a finished lease makes the worker republish the recorded result, an expired lease lets the copy
run). A queued attempt's deadline is its emission + the job's timeout + the workers' lease TTL +
a grace period; a running attempt's is the scheduler's receipt of its "running" result + the
same (the run ends by its start + timeout, the worker enforcing it, and a dead holder's lease
expires one TTL after its last renewal). After ``max_rescues`` re-emissions, or once a copy
could reach a worker after the finished lease was purged (``rescue_horizon_ms``), the attempt
fails with reason ``lost`` and the job's retry policy applies.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from duetime.core.backfill import MAX_OCCURRENCES, backfill_execution_id
from duetime.core.calendars import Calendar, parse_calendar
from duetime.core.dag import REPAIR_REASON
from duetime.core.errors import IllegalTransition
from duetime.core.inputs import MAX_TIME_MS, check_number, is_uuid_text
from duetime.core.jobspec import MAX_TIMEOUT_S, _dt, _ms, same_job, schedule_of
from duetime.core.keys import KeyTemplateError, parse_template, resolve_key
from duetime.core.models import (
    ControlKind,
    DagRunEventKind,
    DagRunStatus,
    ErrorReason,
    Overlap,
    ResultStatus,
    Status,
    Trigger,
)
from duetime.core.records import (
    AttemptError,
    Backfill,
    ControlCommand,
    CronSchedule,
    DagNode,
    DagRunEvent,
    DeadLetter,
    ErrorInfo,
    ExecutionRequest,
    ExecutionResult,
    InflightExecution,
    JobDefinition,
    SchedulerState,
)
from duetime.core.retry import MAX_DELAY_LIMIT_S, RetryPolicy, retry_delay_s, should_retry
from duetime.core.retry_rules import MAX_SNOOZES, apply_policy, retry_after_delay_s
from duetime.core.schedule import (
    MAX_JITTER_S,
    OneTime,
    first_fire,
    jitter_ms,
    misfire_fires,
    next_fire,
    overlap_decision,
)
from duetime.core.states import TERMINAL, Event, transition
from duetime.core.topics import check_queue

from .fairness import DEFAULT_INFLIGHT

log = logging.getLogger("duetime.scheduler")

_EXECUTION_NS = uuid.UUID("6f9f3c1e-5d1b-4c1e-9a63-6a0d7e1f2b10")
_EXECUTION_NS_BYTES = _EXECUTION_NS.bytes
_NOT_FIRING = (Status.PAUSED, Status.CANCELLED)
"""Statuses in which a job's schedule does not fire."""


def execution_id_for(job_id: str, scheduled_at_ms: int, trigger: str, salt: str = "") -> str:
    """Deterministic: re-deriving after a restore gives the same id for the same occurrence.

    ``uuid.uuid5`` written out (RFC 4122 §4.3: SHA-1 of namespace + name, version 5, the
    RFC's variant): the same string, in half the time (it ran for every fire)."""
    name = f"{job_id}/{scheduled_at_ms}/{trigger}/{salt}".encode()
    digest = bytearray(hashlib.sha1(_EXECUTION_NS_BYTES + name, usedforsecurity=False).digest())
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    x = digest[:16].hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


@dataclass(frozen=True)
class Policy:
    """Scheduler-wide knobs of the transform (from SchedulerSettings)."""

    misfire_threshold_ms: int = 5_000
    """An occurrence later than this when it is handled counts as missed (misfire policy)."""
    catch_up_cap: int = 100
    catch_up_window_s: float = 24 * 3600.0
    lease_ttl_ms: int = 10_000
    """The workers' lease TTL (DUETIME_LEASE_TTL_S): a dead holder is fenced out this late."""
    rescue_grace_ms: int = 30_000
    """Slack on top of timeout + lease TTL before a missing result counts as lost."""
    max_rescues: int = 3
    """Re-emissions of one attempt before it fails with reason ``lost``."""
    fairness_inflight: int = DEFAULT_INFLIGHT
    """Executions of one fairness key in flight per partition, times the job's weight
    (DUETIME_SCHEDULER_FAIRNESS_INFLIGHT): beyond it, due executions of the key are held."""
    rescue_horizon_ms: int = 7 * 24 * 3600 * 1000 // 2
    """No rescue of an attempt that became due longer ago than this: half the workers' finished
    lease retention (DUETIME_LEASE_RETENTION_S), so a copy has the other half to reach a worker
    before the finished lease it must meet is purged (or the work would run twice)."""
    fire_lead_ms: int = 0
    """How long before its due time a scheduled run or a retry is emitted
    (DUETIME_SCHEDULER_FIRE_LEAD_MS): the transaction and the workers' fetch happen inside the
    lead, and the worker holds the request until its due time (workers never start early).
    Rescue deadlines are not led: they fire at their time."""
    crowd_rate_per_s: float = 0.0
    """The crowd lead (crowd.py, DUETIME_SCHEDULER_CROWD_RATE): the jobs a second this scheduler
    process plans to emit; jobs due closer together than that are fired earlier, by the time
    they take to go out at it (each partition plans with its share)."""
    crowd_lead_max_ms: int = 0
    """...at most this much ahead of the fire lead (DUETIME_SCHEDULER_CROWD_LEAD_MAX_MS; 0: no
    crowd lead)."""

    def rescue_window_ms(self, definition: JobDefinition) -> int:
        """How long an execution of this job may go without a result before it is rescued."""
        return int(definition.timeout_s * 1000) + self.lease_ttl_ms + self.rescue_grace_ms


DEFAULT_POLICY = Policy()


@dataclass(frozen=True, slots=True)
class Rescue:
    """One rescue or one ``lost`` failure, for the partition's log line and metrics once the
    transaction that carries it committed."""

    job_id: str
    execution_id: str
    attempt: int
    rescues: int
    """Re-emissions of this attempt so far (this one included, for a rescue)."""
    status: Status
    """The execution's status when its deadline passed (queued or running)."""
    overdue_ms: int
    lost: bool = False


@dataclass(frozen=True, slots=True)
class Skip:
    """One occurrence that was not run, for the partition's metric once committed
    (``duetime_scheduler_occurrences_skipped_total{reason}``)."""

    job_id: str
    scheduled_at_ms: int
    reason: str
    """``calendar`` (the job's calendar excludes its date) or ``overlap`` (overlap=skip, or
    queue_one with one held already, while an earlier execution is live)."""


@dataclass(slots=True)
class Outputs:
    """What one transform step asks the partition owner to write."""

    executions: list[ExecutionRequest] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    controls: list[ControlCommand] = field(default_factory=list)
    """Control commands for other jobs (a DAG run's ``dag_run_start`` to every member)."""
    dag_run_events: list[DagRunEvent] = field(default_factory=list)
    """DagRunEvents (a DAG run started), for the dag_runs topic."""
    rescues: list[Rescue] = field(default_factory=list)
    """Executions re-emitted or failed ``lost`` by the rescuer (their requests, if any, are in
    ``executions`` too)."""
    skips: list[Skip] = field(default_factory=list)
    """Occurrences not run: excluded by the job's calendar, or by its overlap policy."""
    state_changed: bool = False

    def extend(self, other: Outputs) -> None:
        """Add ``other``'s records after this one's (a later step of the same cycle)."""
        self.executions += other.executions
        self.dead_letters += other.dead_letters
        self.controls += other.controls
        self.dag_run_events += other.dag_run_events
        self.rescues += other.rescues
        self.skips += other.skips
        self.state_changed |= other.state_changed

    def records(self) -> bool:
        """Whether there is any record to write (state changes aside)."""
        return bool(self.executions or self.dead_letters or self.controls or self.dag_run_events)


# --- conversions -------------------------------------------------------------------------


def retry_policy_of(definition: JobDefinition) -> RetryPolicy:
    r = definition.retry
    return RetryPolicy(
        r.max_retries,
        r.base_delay_s,
        r.max_delay_s,
        r.jitter,
        tuple(r.non_retryable_http_statuses),
        tuple(r.non_retryable_errors),
        r.respect_retry_after,
    )


_LIVE = (Status.QUEUED, Status.RUNNING)
"""Statuses of an in-flight execution that waits for a result (it has a rescue deadline)."""


def wake_at_ms(state: SchedulerState, lead_ms: int = 0) -> int | None:
    """The earliest instant this job needs the timer: next run or a retry (``lead_ms`` before
    its due time: ``Policy.fire_lead_ms``), or a rescue deadline (at its time).

    A live entry without a deadline (a state written before rescues existed) wakes the job at
    once, so ``fire_due`` gives it one: no execution stays in flight without a deadline."""
    return min((wake for wake, _ in _wakes(state, lead_ms)), default=None)


def led_wake_ms(state: SchedulerState, lead_ms: int) -> int | None:
    """The earliest of the job's wake-ups that a lead moves (``lead_ms`` before a retry's or
    the next occurrence's due time), None when it has none: rescue deadlines are never led,
    nor an occurrence that overlap ``skip`` / ``queue_one`` judges at its time. The crowd lead
    (crowd.py) fires a job popped ahead of its wake-up only for these."""
    return min((wake for wake, led in _wakes(state, lead_ms) if led), default=None)


def _wakes(state: SchedulerState, lead_ms: int) -> Iterator[tuple[int, bool]]:
    """Each wake-up of the job, and whether a lead moves it."""
    for e in state.inflight:
        if e.held:
            continue  # released by the partition's fairness gate, not by the timer
        if e.status is Status.FAILED:
            yield e.due_at_ms - lead_ms, True
        else:
            yield (e.due_at_ms if e.deadline_ms is None else e.deadline_ms), False
    if state.next_run_at_ms is not None and state.status not in _NOT_FIRING:
        led = _schedule_led(state)
        yield fire_ms(state, state.next_run_at_ms) - (lead_ms if led else 0), led


def _schedule_lead_ms(state: SchedulerState, lead_ms: int) -> int:
    """The fire lead of the job's next occurrence: none while an earlier execution is live and
    the overlap policy looks at it (skip, queue_one), so that the policy judges the occurrence
    at its due time, as without a lead."""
    return lead_ms if lead_ms and _schedule_led(state) else 0


def _schedule_led(state: SchedulerState) -> bool:
    return not (_live(state) and state.definition.overlap is not Overlap.ALLOW)


def fire_ms(state: SchedulerState, nominal_ms: int) -> int:
    """When the scheduled occurrence ``nominal_ms`` fires: plus its jitter (cron only). The
    state keeps the NOMINAL occurrence (``next_run_at_ms``): the cron sequence, misfire,
    overlap and the execution id all stay those of the nominal time, and the jitter is derived
    again from it on any scheduler, so a failover neither moves nor repeats a run."""
    schedule = state.definition.schedule
    if not isinstance(schedule, CronSchedule) or not schedule.jitter_s:
        return nominal_ms
    return nominal_ms + jitter_ms(state.job_id, nominal_ms, schedule.jitter_s)


def calendar_excludes(state: SchedulerState, nominal_ms: int) -> bool:
    """Does the job's calendar (the copy in its definition) exclude this occurrence?"""
    schedule = state.definition.schedule
    if not isinstance(schedule, CronSchedule) or schedule.calendar is None:
        return False
    spec = schedule.calendar
    calendar = _calendar(
        spec.name, spec.timezone, tuple(spec.exclude), tuple(spec.exclude_weekdays)
    )
    return calendar.excludes(_dt(nominal_ms))


@functools.lru_cache(maxsize=1024)
def _calendar(
    name: str, timezone: str, exclude: tuple[str, ...], weekdays: tuple[str, ...]
) -> Calendar:
    """A job's calendar rules, parsed once per distinct rule set: parsing 1,000 entries costs
    ~3 ms, and a backfill may look at thousands of occurrences in one step (a pure memo)."""
    return parse_calendar(
        {
            "name": name,
            "timezone": timezone,
            "exclude": list(exclude),
            "exclude_weekdays": list(weekdays),
        }
    )


def _move(state: SchedulerState, event: Event) -> None:
    """Apply the state machine; an event that does not apply (late, duplicate) changes nothing."""
    try:
        state.status = transition(state.status, event)
    except IllegalTransition:
        log.debug("ignored %s in %s", event.value, state.status, extra={"job_id": state.job_id})


# --- inputs ------------------------------------------------------------------------------

Input = JobDefinition | ControlCommand | ExecutionResult


def check_input(record: Input) -> None:
    """Refuse a decodable input no producer of ours can have written: it goes to the poison
    topic instead of being held or stored forever (job ids are UUIDs everywhere: the SDK and
    the API check them; attempts count from 1; a result names a UUID execution)."""
    _check_uuid(record.job_id, "job_id")
    if isinstance(record, JobDefinition):
        _check_definition(record)
    if isinstance(record, ControlCommand):
        _check_backfill(record)
    if isinstance(record, ExecutionResult):
        _check_uuid(record.execution_id, "execution_id")
        if record.attempt < 1:
            raise ValueError(f"attempt {record.attempt} is not 1-based")
        if record.lease_token < 0:
            raise ValueError(f"lease_token {record.lease_token} is negative")
        _check_time(record.scheduled_at_ms, "scheduled_at_ms")
        if record.retry_after_s is not None:
            check_number(record.retry_after_s, "retry_after_s", lo=0, hi=MAX_DELAY_LIMIT_S)


def _check_backfill(command: ControlCommand) -> None:
    _check_time(command.backfill_from_ms, "backfill_from_ms")
    _check_time(command.backfill_to_ms, "backfill_to_ms")
    if command.kind is not ControlKind.BACKFILL:
        return
    first, last = command.backfill_from_ms, command.backfill_to_ms
    if first is None or last is None or last < first:
        raise ValueError(f"backfill {command.command_id}: [{first}, {last}] is not a range")


def _check_time(at_ms: int | None, name: str) -> None:
    if at_ms is not None and not 0 <= at_ms <= MAX_TIME_MS:
        raise ValueError(f"{name} {at_ms} is not a time duetime can have written")


def _check_definition(definition: JobDefinition) -> None:
    """The numbers the scheduler computes with, in the ranges the SDK and the API allow: a
    timeout of -1e16 s written past them would make deadlines no state record can hold."""
    check_number(definition.timeout_s, "timeout_s", lo=0, lo_open=True, hi=MAX_TIMEOUT_S)
    if definition.revision < 0:
        raise ValueError(f"revision {definition.revision} is negative")
    _check_time(definition.created_at_ms, "created_at_ms")
    _check_time(definition.updated_at_ms, "updated_at_ms")
    check_queue(definition.queue)  # it names topics: "a.b" or "../x" written past the SDK
    schedule = definition.schedule
    if isinstance(schedule, CronSchedule):
        _check_time(schedule.start_at_ms, "schedule.start_at_ms")
        _check_time(schedule.end_at_ms, "schedule.end_at_ms")
        if schedule.jitter_s is not None:
            check_number(schedule.jitter_s, "schedule.jitter_s", lo=0, hi=MAX_JITTER_S)
        if schedule.calendar is not None:  # refused here, not on every occurrence it would fire
            parse_calendar(schedule.calendar.to_avro(), "schedule.calendar")
    elif schedule is not None:
        _check_time(schedule.at_ms, "schedule.at_ms")
    retry_policy_of(definition)  # RetryPolicy validates its numbers when built
    if definition.fairness is not None:  # refused here, not at every execution it would hold
        fairness_key_of(definition)


def _check_uuid(value: str, name: str) -> None:
    if is_uuid_text(value):  # the form written everywhere; uuid.UUID takes others too
        return
    try:
        uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"{name} {value!r} is not a UUID") from None


def new_state(definition: JobDefinition, now_ms: int) -> SchedulerState:
    blocked = bool(definition.dag_id) and bool(definition.depends_on)
    status = transition(None, Event.CREATE_BLOCKED if blocked else Event.CREATE)
    schedule = None if blocked else schedule_of(definition.schedule)
    # the schedule starts when the job was created, not when this scheduler first saw it: runs
    # that fell due while no scheduler was up are misfires, handled by the job's policy
    created_ms = definition.created_at_ms or now_ms
    first = None if schedule is None else first_fire(schedule, _dt(created_ms))
    return SchedulerState(
        job_id=definition.job_id,
        definition=definition,
        status=status,
        next_run_at_ms=None if first is None else _ms(first),
        updated_at_ms=now_ms,
    )


def on_definition(
    state: SchedulerState | None, definition: JobDefinition, now_ms: int
) -> tuple[SchedulerState, Outputs]:
    """A create or an update. Re-delivered or older revisions change nothing."""
    out = Outputs()
    if state is None:
        out.state_changed = True
        return new_state(definition, now_ms), out
    if same_job(definition, state.definition) or definition.revision <= state.definition.revision:
        return state, out  # a re-create of the same job, or an older revision: nothing to do
    _check_same_kind(state.definition, definition)
    state.definition = definition
    state.updated_at_ms = now_ms
    if state.status not in _NOT_FIRING:
        schedule = schedule_of(definition.schedule)
        first = None if schedule is None else first_fire(schedule, _dt(now_ms))
        state.next_run_at_ms = None if first is None else _ms(first)
    out.state_changed = True
    return state, out


def _check_same_kind(old: JobDefinition, new: JobDefinition) -> None:
    """An update may not move a job into, out of or between DAGs, nor make it a DAG's trigger:
    a DAG member written with the id of an existing job would otherwise take it over (the API
    answers 409; this holds for records written past it)."""
    old_trigger = DAG_LABEL in old.labels
    new_trigger = DAG_LABEL in new.labels
    if old.dag_id != new.dag_id or old_trigger != new_trigger:
        raise ValueError(
            f"a definition may not move job {old.job_id} into, out of or between DAGs "
            f"(dag_id {old.dag_id} → {new.dag_id})"
        )


def quarantine(state: SchedulerState, reason: str, now_ms: int) -> Outputs:
    """The scheduler could not handle this job (an exception from its own logic, on content
    no producer of ours writes): the job stops for good — ``dead``, no next run, no retries,
    nothing in flight tracked — and a dead letter says why, so its partition goes on."""
    out = Outputs(state_changed=True)
    if state.status is Status.CANCELLED:
        return out
    _move(state, Event.QUARANTINE)
    state.next_run_at_ms = None
    state.queued_occurrence_ms = None
    state.inflight = []
    state.updated_at_ms = now_ms
    error = ErrorInfo(
        type="SchedulerError", message=reason[:1000], retryable=False, reason=ErrorReason.ERROR
    )
    entry = InflightExecution(
        execution_id=execution_id_for(state.job_id, now_ms, "quarantine"),
        attempt=1,
        scheduled_at_ms=now_ms,
        due_at_ms=now_ms,
        status=Status.DEAD,
        errors=[AttemptError(attempt=1, at_ms=now_ms, error=error)],
    )
    try:
        out.dead_letters.append(_dead_letter(state, entry, now_ms))
    except (KeyError, TypeError, ValueError) as exc:  # a definition too broken to describe
        log.error("no dead letter for a quarantined job: %s", exc, extra={"job_id": state.job_id})
    return out


# --- control commands: one pure function per kind ----------------------------------------
#
# Each applies one command to the job's state and returns whether it changed anything (a
# repeated or late command does nothing); ``on_control`` stamps ``updated_at_ms`` on a change.

_OnControl = Callable[[SchedulerState, ControlCommand, int, Policy, Outputs], bool]


def _pause(state: SchedulerState, _c: ControlCommand, now_ms: int, _p: Policy, _o: Outputs) -> bool:
    if state.status in _NOT_FIRING:
        return False
    _move(state, Event.PAUSE)
    state.paused_at_ms = now_ms
    return True


def _resume(
    state: SchedulerState, _c: ControlCommand, now_ms: int, policy: Policy, out: Outputs
) -> bool:
    if state.status is not Status.PAUSED:
        return False
    _move(state, Event.RESUME)
    _catch_up(state, now_ms, policy, out)
    state.paused_at_ms = None
    _advance_backfills(state, now_ms, out)
    return True


def _cancel(
    state: SchedulerState, _c: ControlCommand, now_ms: int, _p: Policy, out: Outputs
) -> bool:
    if state.status is Status.CANCELLED:
        return False
    _move(state, Event.CANCEL)
    state.next_run_at_ms = None
    state.queued_occurrence_ms = None
    # retries waiting for their backoff, and executions held for fairness (never emitted),
    # will not run: no further runs
    state.inflight = [e for e in state.inflight if e.status is not Status.FAILED and not e.held]
    for backfill in state.backfills:  # no further runs: what is left of a backfill is dropped
        backfill.after_ms = backfill.to_ms
    if not is_dag_trigger(state):
        # a DAG member: every run it has not ended in would otherwise wait for it forever
        for run_id, status in list(state.dag_runs.items()):
            if status not in TERMINAL:
                _node_cancelled(state, run_id, now_ms, out)
    return True


def _trigger(
    state: SchedulerState, command: ControlCommand, now_ms: int, _p: Policy, out: Outputs
) -> bool:
    if state.status is Status.CANCELLED:
        return False
    salt = command.command_id
    if is_dag_trigger(state):
        _start_dag_run(
            state, command.issued_at_ms, Trigger.MANUAL, now_ms, out, salt, command.dag_run_id
        )
    else:
        _emit(state, command.issued_at_ms, Trigger.MANUAL, now_ms, out, salt=salt)
    return True


def _replay(
    state: SchedulerState, command: ControlCommand, now_ms: int, _p: Policy, out: Outputs
) -> bool:
    if state.status is Status.CANCELLED or is_dag_trigger(state):
        return False
    run_id = command.dag_run_id
    if run_id and state.definition.dag_id:
        return _replay_in_run(state, command, run_id, now_ms, out)
    # one replay per dead execution: a second command for the same dead execution derives
    # the same new execution id, which is not emitted twice while in flight and whose
    # finished lease the worker does not run again (issue 13, finding 12)
    dead_id = command.execution_id
    salt = f"replay/{dead_id}" if dead_id else command.command_id
    _emit(state, now_ms, Trigger.REPLAY, now_ms, out, salt=salt)
    return True


def _release(
    state: SchedulerState, command: ControlCommand, now_ms: int, _p: Policy, out: Outputs
) -> bool:
    run_id = command.dag_run_id or ""
    current = state.dag_runs.get(run_id)
    # a repaired run releases its dead and skipped members again (or one whose entry was
    # pruned since); any other release of an entry not blocked is a repeat, which does nothing
    repair = command.reason == REPAIR_REASON and (current is None or current in _REPAIRED)
    if current is not Status.BLOCKED and not repair:
        return False
    if state.status is Status.CANCELLED:
        _node_cancelled(state, run_id, now_ms, out)  # a cancelled job runs no more
        return True
    state.dag_runs[run_id] = Status.PENDING
    # each repair's execution is a new one (the command id differs per repair)
    salt = f"{run_id}/{command.command_id}" if repair else run_id
    _emit(state, now_ms, Trigger.RELEASE, now_ms, out, salt=salt, dag_run_id=run_id)
    state.dag_runs[run_id] = Status.QUEUED
    return True


def _skip(state: SchedulerState, command: ControlCommand, _n: int, _p: Policy, _o: Outputs) -> bool:
    run_id = command.dag_run_id or ""
    # only a member still waiting for its upstreams (or one whose entry was pruned) is
    # skipped: a released one cannot descend from a dead node of this run, so a skip that
    # finds it released (or ended) is stale, a resend from before a repair of the run
    if state.dag_runs.get(run_id, Status.BLOCKED) is not Status.BLOCKED:
        return False
    state.dag_runs[run_id] = Status.SKIPPED
    _move(state, Event.SKIP)
    _prune_dag_runs(state)
    return True


def _dag_run_start(
    state: SchedulerState, command: ControlCommand, now_ms: int, _p: Policy, out: Outputs
) -> bool:
    run_id = command.dag_run_id or ""
    if run_id in state.dag_runs:
        return False
    if state.status is Status.CANCELLED:
        _node_cancelled(state, run_id, now_ms, out)  # the run must not wait for it
    elif state.definition.depends_on:
        state.dag_runs[run_id] = Status.BLOCKED
        _move(state, Event.BLOCK)
    else:
        state.dag_runs[run_id] = Status.QUEUED
        _emit(state, now_ms, Trigger.RELEASE, now_ms, out, salt=run_id, dag_run_id=run_id)
    return True


def _dag_run_end(
    state: SchedulerState, command: ControlCommand, now_ms: int, _p: Policy, out: Outputs
) -> bool:
    """The resolver reports a run's end: count it out, then fire a run held by queue_one."""
    run_id = command.dag_run_id or ""
    current = state.dag_runs.get(run_id)
    ok = command.reason == DagRunStatus.SUCCESS  # the resolver sends the run's outcome
    # a failed run may end again, in success, once repaired; otherwise a run ends once
    if current is not Status.RUNNING and not (current is Status.DEAD and ok):
        return False  # unknown, or already ended: a repeated report does nothing
    state.dag_runs[run_id] = Status.SUCCESS if ok else Status.DEAD
    _fire_held(state, now_ms, out)
    _prune_dag_runs(state)
    return True


# --- backfill ----------------------------------------------------------------------------
#
# POST /v1/jobs/{id}/backfill publishes a ``backfill`` command (its command_id is the backfill
# id, derived from the job and the range). The scheduler keeps a cursor per backfill in the
# job's state and emits the range's occurrences in order as the job has room: overlap=allow
# runs up to BACKFILL_PARALLEL of them at once; skip and queue_one run one at a time, each
# once nothing of the job is live (a backfill occurrence waits: overlap never drops it). The
# job's calendar applies; jitter does not (a backfill runs now). Each occurrence's execution
# id derives from the backfill id and the occurrence (duetime.core.backfill), so a failover or
# a repeated command never emits one twice (and the workers' fenced leases never run one twice).

BACKFILL_PARALLEL = 10
"""Backfill occurrences in flight at once for an overlap=allow job."""
MAX_BACKFILLS_KEPT = 10
"""Finished backfills remembered per job (a repeated command for one of them does nothing)."""


def _backfill(
    state: SchedulerState, command: ControlCommand, now_ms: int, _p: Policy, out: Outputs
) -> bool:
    first, last = command.backfill_from_ms, command.backfill_to_ms
    if state.status is Status.CANCELLED or is_dag_trigger(state):
        return False
    if first is None or last is None or last < first:
        return False  # check_input refuses it before it comes here (poison topic)
    if any(b.backfill_id == command.command_id for b in state.backfills):
        return False  # a repeated command: this backfill runs (or ran) already
    state.backfills.append(Backfill(backfill_id=command.command_id, after_ms=first - 1, to_ms=last))
    _advance_backfills(state, now_ms, out)
    _prune_backfills(state)
    return True


def _room(state: SchedulerState) -> int:
    """How many backfill occurrences may start now, by the job's overlap policy."""
    if state.definition.overlap is Overlap.ALLOW:
        running = sum(1 for e in state.inflight if e.trigger is Trigger.BACKFILL)
        return max(0, BACKFILL_PARALLEL - running)
    return 0 if state.inflight or state.queued_occurrence_ms is not None else 1


def _advance_backfills(state: SchedulerState, now_ms: int, out: Outputs) -> None:
    """Emit the next occurrences of the oldest unfinished backfill, as far as there is room."""
    if state.status in _NOT_FIRING or not state.backfills:
        return
    backfill = next((b for b in state.backfills if b.after_ms < b.to_ms), None)
    schedule = schedule_of(state.definition.schedule)
    if backfill is None or schedule is None:
        return
    room = _room(state)
    steps = 0  # bounded work per input: a calendar may exclude long stretches of the range
    while room > 0 and backfill.after_ms < backfill.to_ms and steps < MAX_OCCURRENCES:
        steps += 1
        nominal = next_fire(schedule, _dt(backfill.after_ms))
        nominal_ms = None if nominal is None else _ms(nominal)
        if nominal_ms is None or nominal_ms > backfill.to_ms:
            backfill.after_ms = backfill.to_ms
            break
        backfill.after_ms = nominal_ms
        if calendar_excludes(state, nominal_ms):
            backfill.skipped += 1
            out.skips.append(Skip(state.job_id, nominal_ms, "calendar"))
            continue
        execution_id = backfill_execution_id(backfill.backfill_id, nominal_ms)
        _emit(state, nominal_ms, Trigger.BACKFILL, now_ms, out, execution_id=execution_id)
        backfill.emitted += 1
        room -= 1
    out.state_changed = True


def _prune_backfills(state: SchedulerState, keep: int = MAX_BACKFILLS_KEPT) -> None:
    """Forget the oldest finished backfills beyond ``keep``."""
    finished = [b for b in state.backfills if b.after_ms >= b.to_ms]
    for backfill in finished[: max(0, len(finished) - keep)]:
        state.backfills.remove(backfill)


_ON_CONTROL: dict[ControlKind, _OnControl] = {
    ControlKind.PAUSE: _pause,
    ControlKind.RESUME: _resume,
    ControlKind.CANCEL: _cancel,
    ControlKind.TRIGGER: _trigger,
    ControlKind.REPLAY: _replay,
    ControlKind.RELEASE: _release,
    ControlKind.SKIP: _skip,
    ControlKind.DAG_RUN_START: _dag_run_start,
    ControlKind.DAG_RUN_END: _dag_run_end,
    ControlKind.BACKFILL: _backfill,
}


def on_control(
    state: SchedulerState | None, command: ControlCommand, now_ms: int, policy: Policy
) -> tuple[SchedulerState | None, Outputs]:
    out = Outputs()
    if state is None:
        log.warning(
            "control %s for an unknown job ignored", command.kind, extra={"job_id": command.job_id}
        )
        return state, out
    apply = _ON_CONTROL.get(command.kind)
    if apply is None:  # a kind added to the schema before this scheduler learnt it
        log.warning("unknown control kind %s ignored", command.kind, extra={"job_id": state.job_id})
        return state, out
    if apply(state, command, now_ms, policy, out):
        _arm_deadlines(state, now_ms, policy)
        state.updated_at_ms = now_ms
        out.state_changed = True
    return state, out


def _arm_deadlines(state: SchedulerState, now_ms: int, policy: Policy) -> None:
    """Give every live execution emitted in this step (or restored without one) its deadline:
    one place, whatever path emitted it. Counted from its due time when it was emitted ahead
    of it (the fire lead): the worker holds it until then."""
    window = policy.rescue_window_ms(state.definition)
    for entry in state.inflight:
        if entry.deadline_ms is None and entry.status in _LIVE and not entry.held:
            entry.deadline_ms = max(now_ms, entry.due_at_ms) + window


def _catch_up(state: SchedulerState, now_ms: int, policy: Policy, out: Outputs) -> None:
    """Apply the job's misfire policy to the occurrences missed while it was paused."""
    definition = state.definition
    schedule = schedule_of(definition.schedule)
    if schedule is None:
        return
    missed_after_ms = state.paused_at_ms or now_ms
    if state.next_run_at_ms is not None:
        missed_after_ms = min(missed_after_ms, state.next_run_at_ms - 1)
    fires = misfire_fires(
        schedule,
        definition.misfire,
        _dt(missed_after_ms),
        _dt(now_ms),
        policy.catch_up_cap,
        policy.catch_up_window_s,
    )
    for t in fires:
        _fire_occurrence(state, _ms(t), now_ms, out, trigger=Trigger.MISFIRE)
    nxt = next_fire(schedule, _dt(now_ms))
    state.next_run_at_ms = None if nxt is None else _ms(nxt)


# --- results -----------------------------------------------------------------------------


def on_result(
    state: SchedulerState | None,
    result: ExecutionResult,
    now_ms: int,
    rng: random.Random,
    policy: Policy = DEFAULT_POLICY,
) -> tuple[SchedulerState | None, Outputs]:
    """A worker's report. Stale reports (other attempt, lower fencing token) change nothing."""
    out = Outputs()
    if state is None:
        return state, out
    entry = next((e for e in state.inflight if e.execution_id == result.execution_id), None)
    if (
        entry is None
        or entry.held  # this attempt was never emitted: a report of it is stale or forged
        or entry.attempt != result.attempt
        or result.lease_token < entry.lease_token
    ):
        return state, out
    entry.lease_token = result.lease_token
    if result.status is ResultStatus.RUNNING:
        if entry.status is Status.RUNNING:
            return state, out
        entry.status = Status.RUNNING
        # the run ends by its start + timeout (the worker enforces it), or its holder died and
        # its lease expires one TTL after the last renewal: judged from this receipt, on this
        # scheduler's clock (the worker's clock is not compared with ours)
        entry.deadline_ms = now_ms + policy.rescue_window_ms(state.definition)
        _move(state, Event.START)
    elif result.status is ResultStatus.SUCCESS:
        state.inflight.remove(entry)
        _move(state, Event.SUCCEED)
        _after_occurrence(state, now_ms, out, entry)
    else:
        if entry.status is Status.FAILED:
            return state, out  # this attempt's failure was applied already (a republished result)
        if result.error is not None and result.error.reason is ErrorReason.EXPIRED:
            _expire(state, entry, out, now_ms)
        else:
            _on_failure(state, entry, result, now_ms, rng, out)
    _arm_deadlines(state, now_ms, policy)  # an execution fired by overlap=queue_one
    state.updated_at_ms = now_ms
    out.state_changed = True
    return state, out


_NO_ERROR = ErrorInfo(
    type="Unknown", message="failed without an error", retryable=True, reason=ErrorReason.ERROR
)


def _on_failure(
    state: SchedulerState,
    entry: InflightExecution,
    result: ExecutionResult,
    now_ms: int,
    rng: random.Random,
    out: Outputs,
) -> None:
    error = result.error or _NO_ERROR
    if error.traceback is not None:
        # the traceback (up to 8 KiB) is the projector's, read from the result: kept here it
        # would grow the state changelog and the dead letter by 8 KiB per retry (101 at most)
        error = replace(error, traceback=None)
    error = apply_policy(error, retry_policy_of(state.definition))  # non-retryable statuses/types
    attempt_error = AttemptError(
        attempt=entry.attempt,
        at_ms=result.finished_at_ms or now_ms,
        error=error,
        worker_id=result.worker_id,
    )
    _fail_attempt(state, entry, attempt_error, result.retry_after_s, now_ms, rng, out)


def _expire(state: SchedulerState, entry: InflightExecution, out: Outputs, now_ms: int) -> None:
    """The worker could not start the attempt within the job's ``start_within_s``: it was not
    run. The occurrence ends ``expired``: no retry (a retry would be later still) and no dead
    letter (nothing failed: the backlog's stale work is dropped by design, and the execution's
    status says so). A recurring job fires its next occurrence as after any other end."""
    state.inflight.remove(entry)
    _move(state, Event.EXPIRE)
    _after_occurrence(state, now_ms, out, entry)


def _fail_attempt(
    state: SchedulerState,
    entry: InflightExecution,
    attempt_error: AttemptError,
    retry_after_s: float | None,
    now_ms: int,
    rng: random.Random,
    out: Outputs,
) -> None:
    """The latest attempt failed: a retry when the policy allows it, else dead."""
    error = attempt_error.error
    entry.errors.append(attempt_error)
    entry.deadline_ms = None  # nothing to rescue while it waits for its retry
    policy = retry_policy_of(state.definition)
    # a snooze (RetryLater(snooze=True)) uses no attempt, up to MAX_SNOOZES per execution
    snoozed = error.reason is ErrorReason.SNOOZED and entry.snoozes < MAX_SNOOZES
    if snoozed and error.retryable:
        entry.snoozes += 1
    series_attempt = entry.attempt - entry.series_start + 1 - entry.snoozes
    can_retry = (
        error.retryable
        and state.status is not Status.CANCELLED
        and (snoozed or should_retry(series_attempt, policy))
    )
    if can_retry:
        delay_s = retry_after_delay_s(
            retry_after_s,
            from_http=error.http_status is not None,
            respect_retry_after=policy.respect_retry_after,
            max_delay_s=policy.max_delay_s,
        )
        if delay_s is None:
            delay_s = retry_delay_s(max(series_attempt, 1) - 1, policy, rng)
        entry.status = Status.FAILED
        entry.due_at_ms = now_ms + int(delay_s * 1000)
        _move(state, Event.FAIL_RETRYABLE)
        return
    state.inflight.remove(entry)
    _move(state, Event.FAIL_FINAL)
    out.dead_letters.append(_dead_letter(state, entry, now_ms))
    _after_occurrence(state, now_ms, out, entry)


def refuse_unroutable(
    state: SchedulerState, execution_id: str, reason: str, now_ms: int, out: Outputs
) -> None:
    """An execution request that cannot be written: its queue has no topics (removed, or
    named by a definition written past the SDK's check). Its request is withdrawn from
    ``out`` and the attempt fails for good, with ``reason`` in its dead letter: retrying
    would meet the same missing topic, and aborting the transaction for it would stall the
    whole partition. The job goes on (its next occurrence, maybe in a queue that exists)."""
    out.executions[:] = [r for r in out.executions if r.execution_id != execution_id]
    entry = next((e for e in state.inflight if e.execution_id == execution_id), None)
    if entry is None:
        return
    error = ErrorInfo(
        type="UnknownQueue", message=reason[:1000], retryable=False, reason=ErrorReason.ERROR
    )
    attempt_error = AttemptError(attempt=entry.attempt, at_ms=now_ms, error=error)
    _fail_attempt(state, entry, attempt_error, None, now_ms, random.Random(0), out)
    state.updated_at_ms = now_ms
    out.state_changed = True


def _after_occurrence(
    state: SchedulerState, now_ms: int, out: Outputs, entry: InflightExecution
) -> None:
    """An execution ended (success or dead): DAG bookkeeping, queued overlap, next occurrence."""
    run_id = entry.dag_run_id
    if run_id and run_id in state.dag_runs:
        state.dag_runs[run_id] = state.status
        _prune_dag_runs(state)
    _fire_held(state, now_ms, out)
    _advance_backfills(state, now_ms, out)


def _fire_held(state: SchedulerState, now_ms: int, out: Outputs) -> None:
    """Fire the occurrence held back by overlap=queue_one once nothing is live any more."""
    held = state.queued_occurrence_ms
    if held is not None and not _live(state):
        state.queued_occurrence_ms = None
        _fire_occurrence(state, held, now_ms, out, trigger=Trigger.SCHEDULE, held=True)


def _live(state: SchedulerState) -> int:
    if is_dag_trigger(state):  # what a DAG's overlap policy counts: its runs still going
        return sum(1 for s in state.dag_runs.values() if s is Status.RUNNING)
    return len(state.inflight)


def _dead_letter(state: SchedulerState, entry: InflightExecution, now_ms: int) -> DeadLetter:
    return DeadLetter(
        execution_id=entry.execution_id,
        job_id=state.job_id,
        name=state.definition.name,
        dead_at_ms=now_ms,
        attempts=entry.attempt,
        errors=list(entry.errors),
        request=execution_request(state, entry, now_ms),
        dag_id=state.definition.dag_id,
        dag_run_id=entry.dag_run_id,
    )


# --- the timer ---------------------------------------------------------------------------


def fire_due(
    state: SchedulerState, now_ms: int, policy: Policy, owned_since_ms: int | None = None
) -> Outputs:
    """Everything of this job that is due at ``now_ms``: rescues, then the retries and the next
    occurrence due within the policy's fire lead (emitted now, carrying their due time)."""
    out = Outputs()
    retry_by_ms = now_ms + policy.fire_lead_ms
    for entry in list(state.inflight):  # a lost attempt with no retry left leaves the list
        if entry.held:
            continue  # the fairness gate releases it
        if entry.status in _LIVE:
            _check_deadline(state, entry, now_ms, policy, out)
        elif entry.status is Status.FAILED and entry.due_at_ms <= retry_by_ms:
            entry.attempt += 1
            entry.status = Status.QUEUED
            entry.rescues = 0
            if not _hold(state, entry):
                out.executions.append(
                    execution_request(
                        state, entry, now_ms, trigger=Trigger.RETRY, due=entry.due_at_ms
                    )
                )
            _move(state, Event.RETRY_DUE)
            out.state_changed = True
    next_ms = state.next_run_at_ms
    if (
        next_ms is not None
        and fire_ms(state, next_ms) <= now_ms + _schedule_lead_ms(state, policy.fire_lead_ms)
        and state.status not in _NOT_FIRING
    ):
        _fire_schedule(state, next_ms, now_ms, policy, out, owned_since_ms)
        out.state_changed = True
    if out.state_changed:
        _arm_deadlines(state, now_ms, policy)
        state.updated_at_ms = now_ms
    return out


def _check_deadline(
    state: SchedulerState, entry: InflightExecution, now_ms: int, policy: Policy, out: Outputs
) -> None:
    """A live execution whose deadline passed: re-emit it, or fail it ``lost``."""
    if entry.deadline_ms is None:  # restored from a state written before rescues existed
        out.state_changed = True  # fire_due arms it
        return
    if entry.deadline_ms > now_ms:
        return
    out.state_changed = True
    overdue_ms = now_ms - entry.deadline_ms
    if entry.rescues >= policy.max_rescues or now_ms - entry.due_at_ms > policy.rescue_horizon_ms:
        out.rescues.append(_rescue(state, entry, overdue_ms, lost=True))
        _lose(state, entry, now_ms, out)
        return
    entry.rescues += 1
    entry.deadline_ms = now_ms + policy.rescue_window_ms(state.definition)
    out.rescues.append(_rescue(state, entry, overdue_ms))
    # the very request its attempt was emitted with: a retry was emitted as such
    trigger = Trigger.RETRY if entry.attempt > 1 else entry.trigger
    out.executions.append(execution_request(state, entry, now_ms, trigger=trigger))


def _rescue(
    state: SchedulerState, entry: InflightExecution, overdue_ms: int, *, lost: bool = False
) -> Rescue:
    return Rescue(
        state.job_id,
        entry.execution_id,
        entry.attempt,
        entry.rescues,
        entry.status,
        overdue_ms,
        lost,
    )


def _lose(state: SchedulerState, entry: InflightExecution, now_ms: int, out: Outputs) -> None:
    """No result came through every rescue: the attempt fails ``lost`` (retryable: the retry
    policy decides). A retry is a new attempt, which takes the lease over from this one."""
    error = ErrorInfo(
        type="Lost",
        message=(
            f"no result for attempt {entry.attempt} after {entry.rescues} rescue(s): "
            "the execution was lost on its way to or from a worker"
        ),
        retryable=True,
        reason=ErrorReason.LOST,
    )
    attempt_error = AttemptError(attempt=entry.attempt, at_ms=now_ms, error=error)
    # the jitter of a lost attempt's retry is drawn from its identity: the transform stays pure
    rng = random.Random(f"{entry.execution_id}/{entry.attempt}")
    _fail_attempt(state, entry, attempt_error, None, now_ms, rng, out)


def _fire_schedule(
    state: SchedulerState,
    due_ms: int,
    now_ms: int,
    policy: Policy,
    out: Outputs,
    owned_since_ms: int | None = None,
) -> None:
    schedule = schedule_of(state.definition.schedule)
    if schedule is None:
        state.next_run_at_ms = None
        return
    # Missed = fell due while no scheduler owned the partition (``owned_since_ms``: when this
    # owner took it). An occurrence that is late because this owner is busy (a burst) is not
    # a misfire: it fires, late, whatever the job's misfire policy says.
    missed = now_ms - fire_ms(state, due_ms) > policy.misfire_threshold_ms and (
        owned_since_ms is None or due_ms < owned_since_ms
    )
    if missed:
        missed_after_ms = due_ms - 1
        if isinstance(schedule, OneTime):
            # a one-time job is due at max(at, created_at): an `at` in the past lies before
            # its due time and must still count as missed, or the job is skipped for good
            missed_after_ms = min(missed_after_ms, _ms(schedule.at) - 1)
        fires = [
            _ms(t)
            for t in misfire_fires(
                schedule,
                state.definition.misfire,
                _dt(missed_after_ms),
                _dt(now_ms),
                policy.catch_up_cap,
                policy.catch_up_window_s,
            )
        ]
        trigger, after = Trigger.MISFIRE, now_ms
    else:
        fires, trigger, after = [due_ms], Trigger.SCHEDULE, due_ms
    for t in fires:
        _fire_occurrence(state, t, now_ms, out, trigger=trigger)
    if isinstance(schedule, OneTime):
        state.next_run_at_ms = None
        if not fires and not state.inflight:
            _move(state, Event.MISS)  # a missed one-time run under misfire=skip
    else:
        nxt = next_fire(schedule, _dt(after))
        state.next_run_at_ms = None if nxt is None else _ms(nxt)


def _fire_occurrence(
    state: SchedulerState,
    scheduled_ms: int,
    now_ms: int,
    out: Outputs,
    *,
    trigger: Trigger,
    held: bool = False,
) -> None:
    """Fire one occurrence of the schedule, subject to the job's calendar and overlap policy."""
    state.last_scheduled_at_ms = max(state.last_scheduled_at_ms or 0, scheduled_ms)
    if not held and calendar_excludes(state, scheduled_ms):
        out.skips.append(Skip(state.job_id, scheduled_ms, "calendar"))
        return
    queued = 0 if held else (1 if state.queued_occurrence_ms is not None else 0)
    decision = overlap_decision(state.definition.overlap, _live(state), queued)
    if decision == "skip":
        out.skips.append(Skip(state.job_id, scheduled_ms, "overlap"))
        return
    if decision == "queue":
        state.queued_occurrence_ms = scheduled_ms
        return
    if is_dag_trigger(state):
        _start_dag_run(state, scheduled_ms, trigger, now_ms, out)
    else:
        _emit(state, scheduled_ms, trigger, now_ms, out)


_QUEUE_EVENT = {Trigger.MANUAL: Event.TRIGGER, Trigger.REPLAY: Event.REPLAY}
"""The state machine's event for a new execution of the job, by trigger (else ``queue``)."""


def _emit(
    state: SchedulerState,
    scheduled_ms: int,
    trigger: Trigger,
    now_ms: int,
    out: Outputs,
    *,
    salt: str = "",
    dag_run_id: str | None = None,
    execution_id: str | None = None,
) -> None:
    execution_id = execution_id or execution_id_for(state.job_id, scheduled_ms, trigger, salt)
    if any(e.execution_id == execution_id for e in state.inflight):
        return
    entry = InflightExecution(
        execution_id=execution_id,
        attempt=1,
        scheduled_at_ms=scheduled_ms,
        # a scheduled run is due at its (jittered) fire time, however late it is handled
        due_at_ms=(
            fire_ms(state, scheduled_ms)
            if trigger is Trigger.SCHEDULE
            else max(scheduled_ms, now_ms)
        ),
        status=Status.QUEUED,
        trigger=trigger,
        dag_run_id=dag_run_id,
        queue=state.definition.queue,  # every attempt and rescue of it goes to this queue
    )
    state.inflight.append(entry)
    state.fired_count += 1
    # whatever the previous occurrence ended in, the job now has a queued execution (a paused
    # or cancelled job keeps its status: the table's self-loops)
    _move(state, _QUEUE_EVENT.get(trigger, Event.QUEUE))
    if not _hold(state, entry):
        out.executions.append(execution_request(state, entry, now_ms))
    out.state_changed = True


# --- fairness keys (issue 18, item 4) ------------------------------------------------------
#
# An execution of a job with a fairness key is *held* when it falls due (a first attempt or a
# retry): queued in the job's state, no request emitted, no deadline, not woken by the timer.
# The partition's gate (schedulers/fairness.py) counts each key's executions in flight and
# releases held ones (``release_held``) while the key is under its cap. Rescues re-emit
# executions already in flight, so they are never held.


@functools.lru_cache(maxsize=4096)
def _fairness_key(template: str, payload_json: str) -> str:
    return resolve_key(parse_template(template), json.loads(payload_json))


def fairness_key_of(definition: JobDefinition) -> str | None:
    """The job's resolved fairness key (None: it has none); ValueError naming the field when
    its template does not resolve against the payload (a definition written past the API)."""
    if definition.fairness is None:
        return None
    try:
        return _fairness_key(definition.fairness.key, definition.payload_json)
    except KeyTemplateError as exc:
        raise ValueError(f"fairness.key {exc}") from None


def _hold(state: SchedulerState, entry: InflightExecution) -> bool:
    """Hold a due attempt for the fairness gate when the job has a fairness key."""
    key = fairness_key_of(state.definition)
    if key is None:
        return False
    entry.fairness_key = key
    entry.held = True
    entry.deadline_ms = None
    return True


def release_held(
    state: SchedulerState, key: str, now_ms: int, policy: Policy = DEFAULT_POLICY
) -> Outputs:
    """Emit the job's earliest held execution of fairness key ``key`` (the gate found credit
    for it): the request it would have had when it fell due, and its rescue deadline."""
    out = Outputs()
    held = [e for e in state.inflight if e.held and e.fairness_key == key]
    if not held:
        return out
    entry = min(held, key=lambda e: e.due_at_ms)
    entry.held = False
    trigger = Trigger.RETRY if entry.attempt > 1 else entry.trigger
    out.executions.append(execution_request(state, entry, now_ms, trigger=trigger))
    _arm_deadlines(state, now_ms, policy)
    state.updated_at_ms = now_ms
    out.state_changed = True
    return out


# --- DAG runs ----------------------------------------------------------------------------
#
# A DAG's runs are started by its *trigger job*: a hidden job (label ``duetime.dag``) whose
# payload lists the DAG's nodes and which carries the DAG's schedule and overlap policy. Its
# firing (schedule, misfire or a manual trigger) emits, in this scheduler's transaction, a
# ``dag_run_start`` command for every member and the run's ``started`` event, instead of an
# execution request; the resolver reports the run's end back with ``dag_run_end``. Its
# ``dag_runs`` map holds the runs it started: running, then success or dead (= failed).

DAG_LABEL = "duetime.dag"
"""Label of a DAG's trigger job; its value is the dag_id."""
MAX_DAG_RUNS_KEPT = 100
"""Runs remembered per job once they ended (the newest); live runs are never dropped."""

_COMMAND_NS = uuid.UUID("1d1a8f33-70c3-4f7e-a3e5-0c3f4d7b9e21")


def is_dag_trigger(state: SchedulerState) -> bool:
    return DAG_LABEL in state.definition.labels


def dag_nodes(payload_json: str) -> list[DagNode]:
    """The nodes a DAG trigger job's payload lists (``{"nodes": [DagNode, ...]}``); TypeError
    for a payload of another shape (content no producer of ours writes: the job is
    quarantined)."""
    payload: Any = json.loads(payload_json)
    nodes = payload.get("nodes") if isinstance(payload, dict) else None
    if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
        raise TypeError(f"a DAG trigger's payload must list its nodes, not {payload_json:.80}")
    return [DagNode.from_avro(n) for n in nodes]


def _start_dag_run(
    state: SchedulerState,
    scheduled_ms: int,
    trigger: Trigger,
    now_ms: int,
    out: Outputs,
    salt: str = "",
    run_id: str | None = None,
) -> None:
    """Start one DAG run: ``dag_run_start`` to every member and the ``started`` event."""
    run_id = run_id or execution_id_for(state.job_id, scheduled_ms, trigger, salt)
    if run_id in state.dag_runs:
        return  # this run was started already
    dag_id = state.definition.labels[DAG_LABEL]
    nodes = dag_nodes(state.definition.payload_json)
    out.controls += [
        ControlCommand(
            command_id=str(uuid.uuid5(_COMMAND_NS, f"{run_id}/{node.job_id}")),
            job_id=node.job_id,
            kind=ControlKind.DAG_RUN_START,
            issued_at_ms=now_ms,
            dag_id=dag_id,
            dag_run_id=run_id,
            reason=trigger.value,
            requested_by=f"dag-trigger:{state.job_id}",
        )
        for node in nodes
    ]
    out.dag_run_events.append(
        DagRunEvent(
            dag_id=dag_id,
            dag_run_id=run_id,
            kind=DagRunEventKind.STARTED,
            at_ms=now_ms,
            status=DagRunStatus.RUNNING,
            node_statuses={n.key: Status.BLOCKED if n.depends_on else Status.QUEUED for n in nodes},
            nodes=nodes,
            trigger_job_id=state.job_id,
        )
    )
    state.dag_runs[run_id] = Status.RUNNING
    state.fired_count += 1
    state.last_scheduled_at_ms = max(state.last_scheduled_at_ms or 0, scheduled_ms)
    _prune_dag_runs(state)
    out.state_changed = True


_REPAIRED = frozenset({Status.DEAD, Status.SKIPPED, Status.EXPIRED})
"""A member's run entries that a repair's release may run again."""


def _replay_in_run(
    state: SchedulerState, command: ControlCommand, run_id: str, now_ms: int, out: Outputs
) -> bool:
    """A replay of a DAG member's dead letter repairs its run: rather than running the
    member outside the run, ask the resolver (which owns the run's progress) to repair this
    node; it releases it again and unblocks its skipped descendants. A member whose entry for
    the run is not dead (already being repaired, or forgotten) is replayed outside the run,
    as any job (an unknown run must not swallow the replay)."""
    current = state.dag_runs.get(run_id)
    definition = state.definition
    if current in (Status.DEAD, Status.EXPIRED) and definition.dag_id and definition.dag_key:
        # one repair per dead execution, however often its replay is sent; the resolver hands
        # it back as a plain replay if it no longer holds the run (hence the member's job id)
        request_id = f"replay/{command.execution_id or command.command_id}"
        kind = DagRunEventKind.RETRY
        _member_event(state, run_id, kind, now_ms, out, request_id=request_id, with_node=True)
        return True
    if current is not None and current not in TERMINAL:
        return False  # the run is being repaired: this node runs again already
    dead_id = command.execution_id
    salt = f"replay/{dead_id}" if dead_id else command.command_id
    _emit(state, now_ms, Trigger.REPLAY, now_ms, out, salt=salt)
    return True


def _node_cancelled(state: SchedulerState, run_id: str, now_ms: int, out: Outputs) -> None:
    """This member of a DAG run will not run in it: its job was cancelled. The resolver
    learns it from a ``node_cancelled`` event, skips the node's descendants and ends the run
    ``cancelled``, instead of waiting for the node forever."""
    state.dag_runs[run_id] = Status.CANCELLED
    kind = DagRunEventKind.NODE_CANCELLED
    _member_event(state, run_id, kind, now_ms, out, node_status=Status.CANCELLED)
    out.state_changed = True


def _member_event(
    state: SchedulerState,
    run_id: str,
    kind: DagRunEventKind,
    now_ms: int,
    out: Outputs,
    *,
    request_id: str | None = None,
    node_status: Status | None = None,
    with_node: bool = False,
) -> None:
    """A DagRunEvent about this member in one run, for the resolver (dag_runs topic);
    ``with_node``: the member itself (key, job id, upstreams) in ``nodes``."""
    definition = state.definition
    if not (definition.dag_id and definition.dag_key):
        return  # not a DAG member (cannot happen: only members have runs)
    node = DagNode(
        key=definition.dag_key, job_id=state.job_id, depends_on=list(definition.depends_on)
    )
    out.dag_run_events.append(
        DagRunEvent(
            dag_id=definition.dag_id,
            dag_run_id=run_id,
            kind=kind,
            at_ms=now_ms,
            node_key=definition.dag_key,
            node_status=node_status,
            request_id=request_id,
            nodes=[node] if with_node else [],
        )
    )


def _prune_dag_runs(state: SchedulerState, keep: int = MAX_DAG_RUNS_KEPT) -> None:
    """Forget the oldest ended runs beyond ``keep``, so a frequent cron's state stays small.

    A late release for a forgotten run finds no blocked entry and does nothing.
    """
    runs = state.dag_runs
    excess = len(runs) - keep
    if excess <= 0:
        return
    for run_id in [r for r, s in runs.items() if s in TERMINAL][:excess]:
        del runs[run_id]


def execution_request(
    state: SchedulerState,
    entry: InflightExecution,
    now_ms: int,
    *,
    trigger: Trigger | None = None,
    due: int | None = None,
) -> ExecutionRequest:
    definition = state.definition
    return ExecutionRequest(
        execution_id=entry.execution_id,
        job_id=state.job_id,
        name=definition.name,
        attempt=entry.attempt,
        scheduled_at_ms=entry.scheduled_at_ms,
        due_at_ms=entry.due_at_ms if due is None else due,
        emitted_at_ms=now_ms,
        priority=definition.priority,
        target=definition.target,
        payload_json=definition.payload_json,
        timeout_s=definition.timeout_s,
        trigger=trigger or entry.trigger,
        dag_id=definition.dag_id,
        dag_run_id=entry.dag_run_id,
        dag_key=definition.dag_key,
        # a retry's window counts from its own due time: the worker adds it to due_at_ms
        start_within_s=definition.start_within_s,
        queue=entry.queue,
        # the templates as written: the worker resolves the keys (docs/decisions.md)
        concurrency=definition.concurrency,
        rate_limit=definition.rate_limit,
        fairness_key=entry.fairness_key,
        fairness_weight=1 if definition.fairness is None else definition.fairness.weight,
    )
