"""The resolver's transform: pure functions from (a run's progress, one event) to what to send.

No clock, no I/O: the caller passes ``now_ms`` and applies the returned :class:`Actions`
(control commands to the scheduler, DagRunEvents for the dag_runs topic).

A run has two records, both plain JSON-able dicts kept in faust tables keyed by dag_run_id:

- its **shape** (written once, from the run's ``started`` event): the nodes with their job ids
  and upstreams as they were when the run started, and the DAG's trigger job;
- its **progress** (rewritten by every event): the status of every node heard of so far,
  whether the run is done, and with what outcome. Events that arrive before the run's
  ``started`` event (they travel on other topics) are recorded here and acted upon as soon
  as the shape is known.

Node statuses: ``pending`` (released), ``running``, ``failed`` (an attempt failed, a retry may
come: only the scheduler knows, and it says ``dead`` on the DLQ when none will), and the
terminal ``success``, ``dead``, ``skipped``. A terminal status never changes.

Idempotence (the resolver runs at-least-once): what an event implies is derived from the
progress *after* the event, whether or not the event changed anything. A redelivered event
therefore sends again the releases, skips and completion it implied, in case the crash that
caused the redelivery lost them; the scheduler ignores a second release or skip of a job in
the same run, and a completion carries the run's id. Without redelivery nothing is sent twice:
a node is released by the success of its last upstream only.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from duetime.core.dag import descendants, run_outcome

Record = dict[str, Any]
Kids = Mapping[str, Sequence[str]]
"""A shape's child map (``duetime.core.dag.children`` of its nodes), computed by the caller."""

TERMINAL = frozenset({"success", "dead", "skipped"})
STARTED = frozenset({"running", "failed"})
"""A released node that a worker has picked up: releasing it again is pointless."""

_COMMAND_NS = uuid.UUID("a3c6c1c4-8b4e-4f0e-b3a0-57d3d3f2c6a1")

NodeEvent = Literal["running", "failed", "success", "dead"]


@dataclass
class Actions:
    """What one event asks the resolver to write."""

    commands: list[Record] = field(default_factory=list)
    """ControlCommands (release, skip, dag_run_end), for the control topic (key job_id)."""
    events: list[Record] = field(default_factory=list)
    """DagRunEvents (node_status, completed), for the dag_runs topic (key dag_id)."""
    progress_changed: bool = False


# --- records -------------------------------------------------------------------------------


def new_progress(run_id: str, dag_id: str | None, now_ms: int) -> Record:
    return {
        "run_id": run_id,
        "dag_id": dag_id,
        "statuses": {},
        "done": None,
        "trigger_job_id": None,
        "seen_at_ms": now_ms,
        "ended_at_ms": None,
    }


def shape_of(started: Record) -> Record:
    """A run's shape from its ``started`` DagRunEvent."""
    return {
        "dag_id": started["dag_id"],
        "trigger_job_id": started.get("trigger_job_id"),
        "started_at_ms": started["at_ms"],
        "nodes": {n["key"]: list(n["depends_on"]) for n in started["nodes"]},
        "job_ids": {n["key"]: n["job_id"] for n in started["nodes"]},
    }


# --- events --------------------------------------------------------------------------------


def on_started(progress: Record, shape: Record | None, kids: Kids, now_ms: int) -> Actions:
    """The run's shape became known: act on everything heard before it (usually nothing).

    ``shape`` is None only for a redelivered started event of a run already finished.
    """
    out = Actions()
    if progress["done"] is not None or shape is None:
        _completion(progress, now_ms, out)
        return out
    progress["dag_id"] = shape["dag_id"]
    statuses = progress["statuses"]
    for key in [k for k in statuses if k not in shape["nodes"]]:
        del statuses[key]  # not a node of this run (cannot happen with well-formed events)
    for key, status in list(statuses.items()):
        if status == "success":
            _release_children(progress, shape, kids, key, now_ms, out)
        elif status == "dead":
            _skip_descendants(progress, shape, kids, key, now_ms, out)
    _maybe_complete(progress, shape, now_ms, out)
    out.progress_changed = True
    return out


def on_node(
    progress: Record,
    shape: Record | None,
    kids: Kids | None,
    key: str,
    status: NodeEvent,
    now_ms: int,
) -> Actions:
    """A node's result (running, failed, success) or its dead letter (dead).

    ``shape`` and ``kids`` are None while the run's started event has not been seen.
    """
    out = Actions()
    if progress["done"] is not None:
        # a redelivered event of a finished run: say again how it ended, change nothing
        _completion(progress, now_ms, out)
        return out
    if shape is not None and key not in shape["nodes"]:
        return out
    statuses = progress["statuses"]
    current = statuses.get(key)
    if current in TERMINAL and current != status:
        return out  # terminal statuses do not change (e.g. a late "running" after success)
    if current != status:
        statuses[key] = status
        out.progress_changed = True
    if shape is None or kids is None:
        return out  # remembered until the run's started event arrives
    out.events.append(_node_event(progress, key, status, now_ms))
    if status == "success":
        _release_children(progress, shape, kids, key, now_ms, out)
    elif status == "dead":
        _skip_descendants(progress, shape, kids, key, now_ms, out)
    if status in TERMINAL:
        _maybe_complete(progress, shape, now_ms, out)
    return out


# --- what follows from a status ------------------------------------------------------------


def _release_children(
    progress: Record, shape: Record, kids: Kids, key: str, now_ms: int, out: Actions
) -> None:
    statuses = progress["statuses"]
    nodes = shape["nodes"]
    for child in kids.get(key, ()):
        current = statuses.get(child)
        if current in TERMINAL or current in STARTED:
            continue
        if all(statuses.get(dep) == "success" for dep in nodes[child]):
            out.commands.append(_command(progress, shape, child, "release", now_ms))
            if current != "pending":
                statuses[child] = "pending"
                out.progress_changed = True
                out.events.append(_node_event(progress, child, "pending", now_ms))


def _skip_descendants(
    progress: Record, shape: Record, kids: Kids, key: str, now_ms: int, out: Actions
) -> None:
    statuses = progress["statuses"]
    for node in sorted(descendants(shape["nodes"], key, child_map=kids)):
        current = statuses.get(node)
        if current in ("success", "dead"):
            continue  # cannot happen: a descendant of a dead node never ran in this run
        out.commands.append(_command(progress, shape, node, "skip", now_ms))
        if current != "skipped":
            statuses[node] = "skipped"
            out.progress_changed = True
            out.events.append(_node_event(progress, node, "skipped", now_ms))


def _maybe_complete(progress: Record, shape: Record, now_ms: int, out: Actions) -> None:
    outcome = run_outcome(shape["nodes"], progress["statuses"])
    if outcome is None:
        return
    progress["done"] = outcome
    progress["trigger_job_id"] = shape.get("trigger_job_id")
    progress["ended_at_ms"] = now_ms
    out.progress_changed = True
    _completion(progress, now_ms, out)


def _completion(progress: Record, now_ms: int, out: Actions) -> None:
    outcome = progress["done"]
    out.events.append(
        {
            **_event_base(progress, now_ms),
            "kind": "completed",
            "status": outcome,
            "node_statuses": dict(progress["statuses"]),
        }
    )
    trigger_job_id = progress.get("trigger_job_id")
    if trigger_job_id:
        # the DAG's trigger job counts live runs for its overlap policy
        out.commands.append(
            {
                "command_id": _command_id(progress["run_id"], trigger_job_id, "dag_run_end"),
                "job_id": trigger_job_id,
                "kind": "dag_run_end",
                "issued_at_ms": now_ms,
                "dag_id": progress["dag_id"],
                "dag_run_id": progress["run_id"],
                "execution_id": None,
                "reason": outcome,
                "requested_by": "resolver",
            }
        )


# --- retention -----------------------------------------------------------------------------


def expired(
    progress: Record, has_shape: bool, now_ms: int, done_retention_ms: int, orphan_retention_ms: int
) -> bool:
    """Whether a run's entries may be dropped from the tables.

    A finished run is kept ``done_retention_ms`` after it ended (long enough for any redelivery
    to find it finished, which is seconds); events of a run whose ``started`` never came are
    kept ``orphan_retention_ms``. A run that started and has not finished is never dropped.
    """
    if progress["done"] is not None:
        return now_ms - (progress.get("ended_at_ms") or now_ms) > done_retention_ms
    return not has_shape and now_ms - progress["seen_at_ms"] > orphan_retention_ms


# --- helpers -------------------------------------------------------------------------------


def _command_id(run_id: str, job_id: str, kind: str) -> str:
    """Deterministic: a resent command has the id of the first one."""
    return str(uuid.uuid5(_COMMAND_NS, f"{run_id}/{job_id}/{kind}"))


def _command(progress: Record, shape: Record, key: str, kind: str, now_ms: int) -> Record:
    job_id = shape["job_ids"][key]
    return {
        "command_id": _command_id(progress["run_id"], job_id, kind),
        "job_id": job_id,
        "kind": kind,
        "issued_at_ms": now_ms,
        "dag_id": shape["dag_id"],
        "dag_run_id": progress["run_id"],
        "execution_id": None,
        "reason": None,
        "requested_by": "resolver",
    }


def _event_base(progress: Record, now_ms: int) -> Record:
    return {
        "dag_id": progress["dag_id"],
        "dag_run_id": progress["run_id"],
        "at_ms": now_ms,
        "status": None,
        "node_key": None,
        "node_status": None,
        "node_statuses": {},
        "nodes": [],
        "trigger_job_id": None,
    }


def _node_event(progress: Record, key: str, status: str, now_ms: int) -> Record:
    return {
        **_event_base(progress, now_ms),
        "kind": "node_status",
        "status": "running",
        "node_key": key,
        "node_status": status,
    }
