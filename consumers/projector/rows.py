"""Pure mapping from decoded events to projection rows: no I/O, no clock.

Every merge here is *commutative and idempotent*: the row a set of events produces does not
depend on the order in which the topics were read, and applying an event twice changes
nothing. That is what makes ``duetime projector --rebuild`` (which reads the topics in another
interleaving than the live run did) produce identical tables.

- jobs: the definition with the highest ``revision`` wins (from the jobs topic or from the
  definition embedded in a scheduler state); the status, ``next_run_at`` and ``status_at``
  come from the scheduler state with the highest offset in its state partition.
- executions: one row per execution, merged from its requests (one per attempt), the
  worker's results and its dead letter. Each attempt's fields have exactly one source event
  kind; duplicates of the same kind are resolved by the highest lease fencing token.
- dead letters, DAGs: the highest ``attempts`` / ``revision`` wins.
- DAG runs: events of one run share a partition of the dag_runs topic, so they are folded in
  offset order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from duetime.core.jobspec import schedule_to_api, target_to_api
from duetime.core.projection import dt, job_row

Record = dict[str, Any]

# execution status of the latest attempt, from the furthest phase it reached
_DEAD = "dead"


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


# --- jobs ----------------------------------------------------------------------------------


def job_row_from_state(state: Mapping[str, Any], offset: int) -> Record:
    row = job_row(state["definition"], with_next_run=False)
    row["status"] = state["status"]
    row["next_run_at"] = dt(state.get("next_run_at_ms"))
    row["status_at"] = dt(state["updated_at_ms"])
    row["state_offset"] = offset
    return row


def merge_job(a: Record | None, b: Record) -> Record:
    """Combine two rows of the same job: the newer definition, the newer status."""
    if a is None:
        return b
    newer_def = b if b["revision"] >= a["revision"] else a
    newer_status = b if b["state_offset"] > a["state_offset"] else a
    merged = dict(newer_def)
    for col in ("status", "next_run_at", "status_at", "state_offset"):
        merged[col] = newer_status[col]
    return merged


# --- executions ----------------------------------------------------------------------------


@dataclass
class Execution:
    """An execution being merged: its identity, its context and one dict per attempt."""

    execution_id: str
    scheduled_at_ms: int
    job_id: str
    name: str = ""
    priority: str = "normal"
    trigger: str | None = None
    dag_id: str | None = None
    dag_run_id: str | None = None
    attempts: dict[int, Record] = field(default_factory=dict)

    def attempt(self, n: int) -> Record:
        return self.attempts.setdefault(n, {"attempt": n})


def execution_from_row(row: Mapping[str, Any]) -> Execution:
    ex = Execution(
        execution_id=str(row["execution_id"]),
        scheduled_at_ms=int(row["scheduled_at"].timestamp() * 1000),
        job_id=str(row["job_id"]),
        name=row["name"],
        priority=row["priority"],
        trigger=row["trigger"],
        dag_id=None if row["dag_id"] is None else str(row["dag_id"]),
        dag_run_id=row["dag_run_id"],
    )
    for a in row["attempts"] or []:
        ex.attempts[int(a["attempt"])] = dict(a)
    return ex


def _context_from_request(ex: Execution, request: Mapping[str, Any]) -> None:
    ex.name = request["name"]
    ex.priority = request["priority"]
    # the first attempt's trigger is why the execution exists; retries say "retry"
    if request["attempt"] == 1 or (ex.trigger is None and request["trigger"] != "retry"):
        ex.trigger = request["trigger"]
    ex.dag_id = request.get("dag_id") or ex.dag_id
    ex.dag_run_id = request.get("dag_run_id") or ex.dag_run_id


def apply_request(ex: Execution, request: Mapping[str, Any]) -> None:
    _context_from_request(ex, request)
    a = ex.attempt(request["attempt"])
    a["due_at"] = iso(request["due_at_ms"])
    a["queued_at"] = iso(request["emitted_at_ms"])
    a["due_at_ms"] = request["due_at_ms"]
    a["queued_at_ms"] = request["emitted_at_ms"]
    a["trigger"] = request["trigger"]


def _newer(a: Record, key: str, token: int, worker: str) -> bool:
    """A report replaces the stored one when its (lease token, worker) is higher."""
    seen = a.get(key)
    return seen is None or (token, worker) >= (seen[0], seen[1])


def apply_result(ex: Execution, result: Mapping[str, Any]) -> None:
    ex.priority = result.get("priority") or ex.priority
    a = ex.attempt(result["attempt"])
    token, worker = int(result["lease_token"]), result["worker_id"]
    status = result["status"]
    if status == "running":
        if not _newer(a, "_start", token, worker):
            return
        a["_start"] = [token, worker]
        a["started_at"] = iso(result.get("started_at_ms"))
        a["started_at_ms"] = result.get("started_at_ms")
        if "_end" not in a:  # the worker that finished the attempt is the one shown
            a["worker_id"] = worker
        return
    if not _newer(a, "_end", token, worker):
        return
    a["_end"] = [token, worker]
    a["result"] = "success" if status == "success" else "failure"
    a["worker_id"] = worker
    a["finished_at"] = iso(result.get("finished_at_ms"))
    a["error"] = result.get("error")
    if result.get("started_at_ms") is not None and "_start" not in a:
        a["started_at"] = iso(result["started_at_ms"])
        a["started_at_ms"] = result["started_at_ms"]


def apply_dead_letter(ex: Execution, dead: Mapping[str, Any]) -> None:
    _context_from_request(ex, dead["request"])
    last = ex.attempt(dead["attempts"])
    last["dead_at"] = iso(dead["dead_at_ms"])
    for err in dead["errors"]:
        a = ex.attempt(err["attempt"])
        # the worker's own report is richer; the dead letter fills attempts nobody reported
        a.setdefault("error", err["error"])
        if a.get("worker_id") is None and err.get("worker_id") is not None:
            a["worker_id"] = err["worker_id"]
        if "result" not in a:
            a["result"] = "failure"
            a["finished_at"] = iso(err["at_ms"])


def _attempt_status(a: Mapping[str, Any]) -> str:
    if a.get("dead_at") is not None:
        return _DEAD
    if a.get("result") == "success":
        return "success"
    if a.get("result") == "failure":
        return "failed"
    if a.get("started_at") is not None:
        return "running"
    return "queued"


def execution_row(ex: Execution) -> Record:
    """The row of a merged execution: the latest attempt's fields, every attempt's history."""
    numbers = sorted(ex.attempts)
    latest = ex.attempts[numbers[-1]]
    first = ex.attempts[numbers[0]]
    history = []
    for n in numbers:
        a = ex.attempts[n]
        history.append({**a, "status": _attempt_status(a)})
    lateness_ms = None
    due = first.get("due_at_ms")
    if due is not None:
        began = first.get("started_at_ms") or first.get("queued_at_ms")
        if began is not None:
            lateness_ms = float(max(0, began - due))
    error = latest.get("error")
    return {
        "execution_id": ex.execution_id,
        "scheduled_at": dt(ex.scheduled_at_ms),
        "job_id": ex.job_id,
        "name": ex.name,
        "priority": ex.priority,
        "status": _attempt_status(latest),
        "attempt": numbers[-1],
        "trigger": ex.trigger,
        "queued_at": _parse(latest.get("queued_at")),
        "started_at": _parse(latest.get("started_at")),
        "finished_at": _parse(latest.get("finished_at")),
        "worker_id": latest.get("worker_id"),
        "error": None if error is None else json.dumps(error, sort_keys=True),
        "attempts": json.dumps(history, sort_keys=True),
        "lateness_ms": lateness_ms,
        "dag_id": ex.dag_id,
        "dag_run_id": ex.dag_run_id,
    }


def _parse(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


# --- dead letters, DAGs, DAG runs ----------------------------------------------------------


def dead_letter_row(dead: Mapping[str, Any]) -> Record:
    request = dict(dead["request"])
    request["target"] = target_to_api(request["target"])
    return {
        "execution_id": dead["execution_id"],
        "job_id": dead["job_id"],
        "name": dead["name"],
        "dead_at": dt(dead["dead_at_ms"]),
        "attempts": dead["attempts"],
        "errors": json.dumps(dead["errors"], sort_keys=True),
        "request": json.dumps(request, sort_keys=True),
        "dag_run_id": dead.get("dag_run_id"),
    }


def dag_row(dag: Mapping[str, Any]) -> Record:
    schedule = schedule_to_api(dag.get("schedule"))
    return {
        "dag_id": dag["dag_id"],
        "name": dag["name"],
        "schedule": None if schedule is None else json.dumps(schedule),
        "overlap": dag["overlap"],
        "nodes": json.dumps(
            [
                {"key": n["key"], "job_id": n["job_id"], "depends_on": list(n["depends_on"])}
                for n in dag["nodes"]
            ]
        ),
        "revision": dag["revision"],
        "created_at": dt(dag["created_at_ms"]),
        "updated_at": dt(dag["created_at_ms"]),
    }


@dataclass
class DagRunDelta:
    """What a batch's events (in offset order) change in one DAG run."""

    dag_run_id: str
    dag_id: str
    first_at_ms: int
    status: str | None = None
    finished_at_ms: int | None = None
    replace_nodes: bool = False
    nodes: dict[str, str] = field(default_factory=dict)

    def apply(self, event: Mapping[str, Any]) -> None:
        kind = event["kind"]
        if kind in ("started", "completed") and event.get("node_statuses"):
            self.replace_nodes = True
            self.nodes = dict(event["node_statuses"])
        if kind == "node_status" and event.get("node_key") and event.get("node_status"):
            self.nodes[event["node_key"]] = event["node_status"]
        if kind == "completed":
            self.status = event.get("status") or "success"
            self.finished_at_ms = event["at_ms"]
        elif kind == "started" and self.status is None:
            self.status = "running"


def fold_dag_runs(events: Iterable[Mapping[str, Any]]) -> dict[str, DagRunDelta]:
    deltas: dict[str, DagRunDelta] = {}
    for event in events:
        run = deltas.get(event["dag_run_id"])
        if run is None:
            run = deltas[event["dag_run_id"]] = DagRunDelta(
                event["dag_run_id"], event["dag_id"], event["at_ms"]
            )
        run.apply(event)
    return deltas
