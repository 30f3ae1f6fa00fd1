"""The scheduler's transform: pure functions from (job state, input event, now) to a new state
and the records to emit.

No clock, no randomness, no I/O: the caller passes ``now_ms`` and a ``random.Random``. The
partition owner applies the outputs in one Kafka transaction together with the consumed
offsets, so every state change and every execution request happen exactly once.

State is the ``SchedulerState`` Avro record as a dict. ``inflight`` lists the executions of the
job that are queued, running, or failed and waiting for their retry; a job's wake-up time
(``wake_at_ms``) is the earliest of its next scheduled run and its retries.
"""

from __future__ import annotations

import json
import logging
import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from duetime.core.errors import IllegalTransition
from duetime.core.jobspec import same_job
from duetime.core.models import Misfire, Overlap, Status
from duetime.core.retry import RetryPolicy, retry_delay_s, should_retry
from duetime.core.schedule import (
    Cron,
    OneTime,
    Schedule,
    first_fire,
    misfire_fires,
    next_fire,
    overlap_decision,
)
from duetime.core.states import Event, transition

log = logging.getLogger("duetime.scheduler")

Record = dict[str, Any]

_EXECUTION_NS = uuid.UUID("6f9f3c1e-5d1b-4c1e-9a63-6a0d7e1f2b10")


def execution_id_for(job_id: str, scheduled_at_ms: int, trigger: str, salt: str = "") -> str:
    """Deterministic: re-deriving after a restore gives the same id for the same occurrence."""
    return str(uuid.uuid5(_EXECUTION_NS, f"{job_id}/{scheduled_at_ms}/{trigger}/{salt}"))


@dataclass(frozen=True)
class Policy:
    """Scheduler-wide knobs of the transform (from SchedulerSettings)."""

    misfire_threshold_ms: int = 5_000
    """An occurrence later than this when it is handled counts as missed (misfire policy)."""
    catch_up_cap: int = 100
    catch_up_window_s: float = 24 * 3600.0


@dataclass
class Outputs:
    """What one transform step asks the partition owner to write."""

    executions: list[Record] = field(default_factory=list)
    dead_letters: list[Record] = field(default_factory=list)
    controls: list[Record] = field(default_factory=list)
    """Control commands for other jobs (a DAG run's ``dag_run_start`` to every member)."""
    dag_run_events: list[Record] = field(default_factory=list)
    """DagRunEvents (a DAG run started), for the dag_runs topic."""
    state_changed: bool = False


# --- conversions -------------------------------------------------------------------------


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def schedule_of(definition: Record) -> Schedule | None:
    raw = definition.get("schedule")
    if raw is None:
        return None
    if "at_ms" in raw:
        return OneTime(_dt(raw["at_ms"]))
    return Cron(
        raw["cron"],
        raw.get("timezone") or "UTC",
        None if raw.get("start_at_ms") is None else _dt(raw["start_at_ms"]),
        None if raw.get("end_at_ms") is None else _dt(raw["end_at_ms"]),
    )


def retry_policy_of(definition: Record) -> RetryPolicy:
    r = definition["retry"]
    return RetryPolicy(r["max_retries"], r["base_delay_s"], r["max_delay_s"], r["jitter"])


def wake_at_ms(state: Record) -> int | None:
    """The earliest instant this job needs the timer: next run or a retry."""
    candidates = [e["due_at_ms"] for e in state["inflight"] if e["status"] == Status.FAILED.value]
    if state.get("next_run_at_ms") is not None and state["status"] not in (
        Status.PAUSED.value,
        Status.CANCELLED.value,
    ):
        candidates.append(state["next_run_at_ms"])
    return min(candidates) if candidates else None


def _move(state: Record, event: Event) -> None:
    """Apply the state machine; an event that does not apply (late, duplicate) changes nothing."""
    try:
        state["status"] = transition(Status(state["status"]), event).value
    except IllegalTransition:
        log.debug(
            "ignored %s in %s", event.value, state["status"], extra={"job_id": state["job_id"]}
        )


# --- inputs ------------------------------------------------------------------------------


def check_input(event_type: str, record: Record) -> None:
    """Refuse a decodable input no producer of ours can have written: it goes to the poison
    topic instead of being held or stored forever (job ids are UUIDs everywhere: the SDK and
    the API check them; attempts count from 1; a result names a UUID execution)."""
    _check_uuid(record, "job_id")
    if event_type == "result":
        _check_uuid(record, "execution_id")
        if record["attempt"] < 1:
            raise ValueError(f"attempt {record['attempt']} is not 1-based")
        if record["lease_token"] < 0:
            raise ValueError(f"lease_token {record['lease_token']} is negative")


def _check_uuid(record: Record, name: str) -> None:
    try:
        uuid.UUID(record[name])
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"{name} {record[name]!r} is not a UUID") from None


def new_state(definition: Record, now_ms: int) -> Record:
    blocked = bool(definition.get("dag_id")) and bool(definition.get("depends_on"))
    status = transition(None, Event.CREATE_BLOCKED if blocked else Event.CREATE)
    schedule = None if blocked else schedule_of(definition)
    # the schedule starts when the job was created, not when this scheduler first saw it: runs
    # that fell due while no scheduler was up are misfires, handled by the job's policy
    created_ms = definition.get("created_at_ms") or now_ms
    first = None if schedule is None else first_fire(schedule, _dt(created_ms))
    return {
        "job_id": definition["job_id"],
        "definition": definition,
        "status": status.value,
        "next_run_at_ms": None if first is None else _ms(first),
        "last_scheduled_at_ms": None,
        "paused_at_ms": None,
        "inflight": [],
        "queued_occurrence_ms": None,
        "fired_count": 0,
        "updated_at_ms": now_ms,
        "dag_runs": {},
    }


def on_definition(state: Record | None, definition: Record, now_ms: int) -> tuple[Record, Outputs]:
    """A create or an update. Re-delivered or older revisions change nothing."""
    out = Outputs()
    if state is None:
        out.state_changed = True
        return new_state(definition, now_ms), out
    if same_job(definition, state["definition"]) or (
        definition["revision"] <= state["definition"]["revision"]
    ):
        return state, out  # a re-create of the same job, or an older revision: nothing to do
    _check_same_kind(state["definition"], definition)
    state["definition"] = definition
    state["updated_at_ms"] = now_ms
    if state["status"] not in (Status.PAUSED.value, Status.CANCELLED.value):
        schedule = schedule_of(definition)
        first = None if schedule is None else first_fire(schedule, _dt(now_ms))
        state["next_run_at_ms"] = None if first is None else _ms(first)
    out.state_changed = True
    return state, out


def _check_same_kind(old: Record, new: Record) -> None:
    """An update may not move a job into, out of or between DAGs, nor make it a DAG's trigger:
    a DAG member written with the id of an existing job would otherwise take it over (the API
    answers 409; this holds for records written past it)."""
    old_trigger = DAG_LABEL in (old.get("labels") or {})
    new_trigger = DAG_LABEL in (new.get("labels") or {})
    if old.get("dag_id") != new.get("dag_id") or old_trigger != new_trigger:
        raise ValueError(
            f"a definition may not move job {old['job_id']} into, out of or between DAGs "
            f"(dag_id {old.get('dag_id')} → {new.get('dag_id')})"
        )


def quarantine(state: Record, reason: str, now_ms: int) -> Outputs:
    """The scheduler could not handle this job (an exception from its own logic, on content
    no producer of ours writes): the job stops for good — ``dead``, no next run, no retries,
    nothing in flight tracked — and a dead letter says why, so its partition goes on."""
    out = Outputs(state_changed=True)
    if state["status"] == Status.CANCELLED.value:
        return out
    _move(state, Event.QUARANTINE)
    state["next_run_at_ms"] = None
    state["queued_occurrence_ms"] = None
    state["inflight"] = []
    state["updated_at_ms"] = now_ms
    entry: Record = {
        "execution_id": execution_id_for(state["job_id"], now_ms, "quarantine"),
        "attempt": 1,
        "scheduled_at_ms": now_ms,
        "due_at_ms": now_ms,
        "status": Status.DEAD.value,
        "errors": [
            {
                "attempt": 1,
                "at_ms": now_ms,
                "error": {
                    "type": "SchedulerError",
                    "message": reason[:1000],
                    "retryable": False,
                    "reason": "error",
                    "http_status": None,
                },
                "worker_id": None,
            }
        ],
        "trigger": "schedule",
        "lease_token": 0,
        "series_start": 1,
        "dag_run_id": None,
    }
    try:
        out.dead_letters.append(_dead_letter(state, entry, now_ms))
    except (KeyError, TypeError, ValueError) as exc:  # a definition too broken to describe
        log.error(
            "no dead letter for a quarantined job: %s", exc, extra={"job_id": state["job_id"]}
        )
    return out


def on_control(
    state: Record | None, command: Record, now_ms: int, policy: Policy
) -> tuple[Record | None, Outputs]:
    out = Outputs()
    if state is None:
        log.warning(
            "control %s for an unknown job ignored",
            command["kind"],
            extra={"job_id": command["job_id"]},
        )
        return state, out
    kind = command["kind"]
    status = state["status"]
    if kind == "pause":
        if status in (Status.PAUSED.value, Status.CANCELLED.value):
            return state, out
        _move(state, Event.PAUSE)
        state["paused_at_ms"] = now_ms
    elif kind == "resume":
        if status != Status.PAUSED.value:
            return state, out
        _move(state, Event.RESUME)
        _resume(state, now_ms, policy, out)
        state["paused_at_ms"] = None
    elif kind == "cancel":
        if status == Status.CANCELLED.value:
            return state, out
        _move(state, Event.CANCEL)
        state["next_run_at_ms"] = None
        state["queued_occurrence_ms"] = None
        # retries waiting for their backoff will not run: no further runs
        state["inflight"] = [e for e in state["inflight"] if e["status"] != Status.FAILED.value]
    elif kind == "trigger":
        if status == Status.CANCELLED.value:
            return state, out
        salt = command["command_id"]
        if is_dag_trigger(state):
            run_id = command.get("dag_run_id")
            _start_dag_run(state, command["issued_at_ms"], "manual", now_ms, out, salt, run_id)
        else:
            _emit(state, command["issued_at_ms"], "manual", now_ms, out, salt=salt)
    elif kind == "replay":
        if status == Status.CANCELLED.value or is_dag_trigger(state):
            return state, out
        # one replay per dead execution: a second command for the same dead execution
        # derives the same new execution id, which is not emitted twice while in flight and
        # whose finished lease the worker does not run again (issue 13, finding 12)
        dead_id = command.get("execution_id")
        salt = f"replay/{dead_id}" if dead_id else command["command_id"]
        _emit(state, now_ms, "replay", now_ms, out, salt=salt)
    elif kind == "release":
        run_id = command.get("dag_run_id") or ""
        if state["dag_runs"].get(run_id) != Status.BLOCKED.value:
            return state, out  # a second release of the same run does nothing
        state["dag_runs"][run_id] = Status.PENDING.value
        _emit(state, now_ms, "release", now_ms, out, salt=run_id, dag_run_id=run_id)
        state["dag_runs"][run_id] = Status.QUEUED.value
    elif kind == "skip":
        run_id = command.get("dag_run_id") or ""
        if state["dag_runs"].get(run_id) in (Status.SKIPPED.value, Status.SUCCESS.value):
            return state, out
        state["dag_runs"][run_id] = Status.SKIPPED.value
        _move(state, Event.SKIP)
        _prune_dag_runs(state)
    elif kind == "dag_run_start":
        run_id = command.get("dag_run_id") or ""
        if run_id in state["dag_runs"]:
            return state, out
        if state["definition"].get("depends_on"):
            state["dag_runs"][run_id] = Status.BLOCKED.value
            _move(state, Event.BLOCK)
        else:
            state["dag_runs"][run_id] = Status.QUEUED.value
            _emit(state, now_ms, "release", now_ms, out, salt=run_id, dag_run_id=run_id)
    elif kind == "dag_run_end":
        if not _end_dag_run(state, command, now_ms, out):
            return state, out
    else:
        log.warning("unknown control kind %s ignored", kind, extra={"job_id": state["job_id"]})
        return state, out
    state["updated_at_ms"] = now_ms
    out.state_changed = True
    return state, out


def _resume(state: Record, now_ms: int, policy: Policy, out: Outputs) -> None:
    """Apply the job's misfire policy to the occurrences missed while it was paused."""
    definition = state["definition"]
    schedule = schedule_of(definition)
    if schedule is None:
        return
    missed_after_ms = state["paused_at_ms"] or now_ms
    if state.get("next_run_at_ms") is not None:
        missed_after_ms = min(missed_after_ms, state["next_run_at_ms"] - 1)
    fires = misfire_fires(
        schedule,
        Misfire(definition["misfire"]),
        _dt(missed_after_ms),
        _dt(now_ms),
        policy.catch_up_cap,
        policy.catch_up_window_s,
    )
    for t in fires:
        _fire_occurrence(state, _ms(t), now_ms, out, trigger="misfire")
    nxt = next_fire(schedule, _dt(now_ms))
    state["next_run_at_ms"] = None if nxt is None else _ms(nxt)


def on_result(
    state: Record | None, result: Record, now_ms: int, rng: random.Random
) -> tuple[Record | None, Outputs]:
    """A worker's report. Stale reports (other attempt, lower fencing token) change nothing."""
    out = Outputs()
    if state is None:
        return state, out
    entry = next(
        (e for e in state["inflight"] if e["execution_id"] == result["execution_id"]), None
    )
    if entry is None or entry["attempt"] != result["attempt"]:
        return state, out
    if result["lease_token"] < entry.get("lease_token", 0):
        return state, out
    entry["lease_token"] = result["lease_token"]
    status = result["status"]
    if status == "running":
        if entry["status"] == Status.RUNNING.value:
            return state, out
        entry["status"] = Status.RUNNING.value
        _move(state, Event.START)
    elif status == "success":
        state["inflight"].remove(entry)
        _move(state, Event.SUCCEED)
        _after_occurrence(state, now_ms, out, entry)
    else:
        if entry["status"] == Status.FAILED.value:
            return state, out  # this attempt's failure was applied already (a republished result)
        _on_failure(state, entry, result, now_ms, rng, out)
    state["updated_at_ms"] = now_ms
    out.state_changed = True
    return state, out


def _on_failure(
    state: Record,
    entry: Record,
    result: Record,
    now_ms: int,
    rng: random.Random,
    out: Outputs,
) -> None:
    error = result.get("error") or {
        "type": "Unknown",
        "message": "failed without an error",
        "retryable": True,
        "reason": "error",
        "http_status": None,
    }
    entry["errors"].append(
        {
            "attempt": entry["attempt"],
            "at_ms": result.get("finished_at_ms") or now_ms,
            "error": error,
            "worker_id": result.get("worker_id"),
        }
    )
    policy = retry_policy_of(state["definition"])
    series_attempt = entry["attempt"] - entry.get("series_start", 1) + 1
    can_retry = (
        error["retryable"]
        and state["status"] != Status.CANCELLED.value
        and should_retry(series_attempt, policy)
    )
    if can_retry:
        delay_s = result.get("retry_after_s")
        if delay_s is None:
            delay_s = retry_delay_s(series_attempt - 1, policy, rng)
        entry["status"] = Status.FAILED.value
        entry["due_at_ms"] = now_ms + int(delay_s * 1000)
        _move(state, Event.FAIL_RETRYABLE)
        return
    state["inflight"].remove(entry)
    _move(state, Event.FAIL_FINAL)
    out.dead_letters.append(_dead_letter(state, entry, now_ms))
    _after_occurrence(state, now_ms, out, entry)


def _after_occurrence(state: Record, now_ms: int, out: Outputs, entry: Record) -> None:
    """An execution ended (success or dead): DAG bookkeeping, queued overlap, next occurrence."""
    run_id = entry.get("dag_run_id")
    if run_id and run_id in state["dag_runs"]:
        state["dag_runs"][run_id] = state["status"]
        _prune_dag_runs(state)
    held = state.get("queued_occurrence_ms")
    if held is not None and not _live(state):
        state["queued_occurrence_ms"] = None
        _fire_occurrence(state, held, now_ms, out, trigger="schedule", held=True)


def _live(state: Record) -> int:
    if is_dag_trigger(state):  # what a DAG's overlap policy counts: its runs still going
        return sum(1 for s in state["dag_runs"].values() if s == Status.RUNNING.value)
    return len(state["inflight"])


def _dead_letter(state: Record, entry: Record, now_ms: int) -> Record:
    return {
        "execution_id": entry["execution_id"],
        "job_id": state["job_id"],
        "name": state["definition"]["name"],
        "dead_at_ms": now_ms,
        "attempts": entry["attempt"],
        "errors": list(entry["errors"]),
        "request": execution_request(state, entry, now_ms),
        "dag_id": state["definition"].get("dag_id"),
        "dag_run_id": entry.get("dag_run_id"),
    }


# --- the timer ---------------------------------------------------------------------------


def fire_due(
    state: Record, now_ms: int, policy: Policy, owned_since_ms: int | None = None
) -> Outputs:
    """Everything of this job that is due at ``now_ms``: retries, then the next occurrence."""
    out = Outputs()
    for entry in state["inflight"]:
        if entry["status"] == Status.FAILED.value and entry["due_at_ms"] <= now_ms:
            entry["attempt"] += 1
            entry["status"] = Status.QUEUED.value
            due = entry["due_at_ms"]
            out.executions.append(execution_request(state, entry, now_ms, trigger="retry", due=due))
            _move(state, Event.RETRY_DUE)
            out.state_changed = True
    next_ms = state.get("next_run_at_ms")
    if (
        next_ms is not None
        and next_ms <= now_ms
        and state["status"] not in (Status.PAUSED.value, Status.CANCELLED.value)
    ):
        _fire_schedule(state, next_ms, now_ms, policy, out, owned_since_ms)
        out.state_changed = True
    if out.state_changed:
        state["updated_at_ms"] = now_ms
    return out


def _fire_schedule(
    state: Record,
    due_ms: int,
    now_ms: int,
    policy: Policy,
    out: Outputs,
    owned_since_ms: int | None = None,
) -> None:
    definition = state["definition"]
    schedule = schedule_of(definition)
    if schedule is None:
        state["next_run_at_ms"] = None
        return
    # Missed = fell due while no scheduler owned the partition (``owned_since_ms``: when this
    # owner took it). An occurrence that is late because this owner is busy (a burst) is not
    # a misfire: it fires, late, whatever the job's misfire policy says.
    missed = now_ms - due_ms > policy.misfire_threshold_ms and (
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
                Misfire(definition["misfire"]),
                _dt(missed_after_ms),
                _dt(now_ms),
                policy.catch_up_cap,
                policy.catch_up_window_s,
            )
        ]
        trigger = "misfire"
        after = now_ms
    else:
        fires, trigger, after = [due_ms], "schedule", due_ms
    for t in fires:
        _fire_occurrence(state, t, now_ms, out, trigger=trigger)
    if isinstance(schedule, OneTime):
        state["next_run_at_ms"] = None
        if not fires and not state["inflight"]:
            state["status"] = Status.SKIPPED.value  # a missed one-time run under misfire=skip
    else:
        nxt = next_fire(schedule, _dt(after))
        state["next_run_at_ms"] = None if nxt is None else _ms(nxt)


def _fire_occurrence(
    state: Record, scheduled_ms: int, now_ms: int, out: Outputs, *, trigger: str, held: bool = False
) -> None:
    """Fire one occurrence of the schedule, subject to the job's overlap policy."""
    queued = 0 if held else (1 if state.get("queued_occurrence_ms") is not None else 0)
    decision = overlap_decision(Overlap(state["definition"]["overlap"]), _live(state), queued)
    state["last_scheduled_at_ms"] = max(state.get("last_scheduled_at_ms") or 0, scheduled_ms)
    if decision == "skip":
        return
    if decision == "queue":
        state["queued_occurrence_ms"] = scheduled_ms
        return
    if is_dag_trigger(state):
        _start_dag_run(state, scheduled_ms, trigger, now_ms, out)
    else:
        _emit(state, scheduled_ms, trigger, now_ms, out)


def _emit(
    state: Record,
    scheduled_ms: int,
    trigger: str,
    now_ms: int,
    out: Outputs,
    *,
    salt: str = "",
    dag_run_id: str | None = None,
) -> None:
    execution_id = execution_id_for(state["job_id"], scheduled_ms, trigger, salt)
    if any(e["execution_id"] == execution_id for e in state["inflight"]):
        return
    entry = {
        "execution_id": execution_id,
        "attempt": 1,
        "scheduled_at_ms": scheduled_ms,
        "due_at_ms": max(scheduled_ms, now_ms) if trigger != "schedule" else scheduled_ms,
        "status": Status.QUEUED.value,
        "errors": [],
        "trigger": trigger,
        "lease_token": 0,
        "series_start": 1,
        "dag_run_id": dag_run_id,
    }
    state["inflight"].append(entry)
    state["fired_count"] += 1
    if state["status"] not in (Status.PAUSED.value, Status.CANCELLED.value):
        # whatever the previous occurrence ended in, the job now has a queued execution
        state["status"] = Status.QUEUED.value
    out.executions.append(execution_request(state, entry, now_ms))
    out.state_changed = True


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
_ENDED = frozenset(
    {Status.SUCCESS.value, Status.DEAD.value, Status.SKIPPED.value, Status.CANCELLED.value}
)


def is_dag_trigger(state: Record) -> bool:
    return DAG_LABEL in (state["definition"].get("labels") or {})


def _dag_nodes(state: Record) -> list[Record]:
    nodes: list[Record] = json.loads(state["definition"]["payload_json"])["nodes"]
    return nodes


def _start_dag_run(
    state: Record,
    scheduled_ms: int,
    trigger: str,
    now_ms: int,
    out: Outputs,
    salt: str = "",
    run_id: str | None = None,
) -> None:
    """Start one DAG run: ``dag_run_start`` to every member and the ``started`` event."""
    run_id = run_id or execution_id_for(state["job_id"], scheduled_ms, trigger, salt)
    if run_id in state["dag_runs"]:
        return  # this run was started already
    dag_id = state["definition"]["labels"][DAG_LABEL]
    nodes = _dag_nodes(state)
    for node in nodes:
        out.controls.append(
            {
                "command_id": str(uuid.uuid5(_COMMAND_NS, f"{run_id}/{node['job_id']}")),
                "job_id": node["job_id"],
                "kind": "dag_run_start",
                "issued_at_ms": now_ms,
                "dag_id": dag_id,
                "dag_run_id": run_id,
                "execution_id": None,
                "reason": trigger,
                "requested_by": f"dag-trigger:{state['job_id']}",
            }
        )
    out.dag_run_events.append(
        {
            "dag_id": dag_id,
            "dag_run_id": run_id,
            "kind": "started",
            "at_ms": now_ms,
            "status": "running",
            "node_key": None,
            "node_status": None,
            "node_statuses": {
                n["key"]: (Status.BLOCKED if n["depends_on"] else Status.QUEUED).value
                for n in nodes
            },
            "nodes": [
                {"key": n["key"], "job_id": n["job_id"], "depends_on": list(n["depends_on"])}
                for n in nodes
            ],
            "trigger_job_id": state["job_id"],
        }
    )
    state["dag_runs"][run_id] = Status.RUNNING.value
    state["fired_count"] += 1
    state["last_scheduled_at_ms"] = max(state.get("last_scheduled_at_ms") or 0, scheduled_ms)
    _prune_dag_runs(state)
    out.state_changed = True


def _end_dag_run(state: Record, command: Record, now_ms: int, out: Outputs) -> bool:
    """The resolver reports a run's end: count it out, then fire a run held by queue_one."""
    run_id = command.get("dag_run_id") or ""
    if state["dag_runs"].get(run_id) != Status.RUNNING.value:
        return False  # unknown, or already ended: a repeated report does nothing
    ok = command.get("reason") == "success"
    state["dag_runs"][run_id] = (Status.SUCCESS if ok else Status.DEAD).value
    held = state.get("queued_occurrence_ms")
    if held is not None and not _live(state):
        state["queued_occurrence_ms"] = None
        _fire_occurrence(state, held, now_ms, out, trigger="schedule", held=True)
    _prune_dag_runs(state)
    return True


def _prune_dag_runs(state: Record, keep: int = MAX_DAG_RUNS_KEPT) -> None:
    """Forget the oldest ended runs beyond ``keep``, so a frequent cron's state stays small.

    A late release for a forgotten run finds no blocked entry and does nothing.
    """
    runs = state["dag_runs"]
    excess = len(runs) - keep
    if excess <= 0:
        return
    for run_id in [r for r, s in runs.items() if s in _ENDED][:excess]:
        del runs[run_id]


def execution_request(
    state: Record, entry: Record, now_ms: int, *, trigger: str | None = None, due: int | None = None
) -> Record:
    definition = state["definition"]
    return {
        "execution_id": entry["execution_id"],
        "job_id": state["job_id"],
        "name": definition["name"],
        "attempt": entry["attempt"],
        "scheduled_at_ms": entry["scheduled_at_ms"],
        "due_at_ms": entry["due_at_ms"] if due is None else due,
        "emitted_at_ms": now_ms,
        "priority": definition["priority"],
        "target": definition["target"],
        "payload_json": definition["payload_json"],
        "timeout_s": definition["timeout_s"],
        "trigger": trigger or entry["trigger"],
        "dag_id": definition.get("dag_id"),
        "dag_run_id": entry.get("dag_run_id"),
        "dag_key": definition.get("dag_key"),
    }
