"""The resolver's transform: pure functions from (a run's progress, one event) to what to send.

No clock, no I/O: the caller passes ``now_ms`` and applies the returned :class:`Actions`
(control commands to the scheduler, DagRunEvents for the dag_runs topic).

A run has two records, kept in faust tables keyed by dag_run_id as plain JSON-able dicts
(``to_table`` / ``from_table``: the dict has the dataclass's fields, so entries written by an
earlier build restore unchanged):

- its :class:`Shape` (written once, from the run's ``started`` event): the nodes with their job
  ids and upstreams as they were when the run started, and the DAG's trigger job;
- its :class:`Progress` (rewritten by every event): the status of every node heard of so far,
  whether the run is done, and with what outcome. Events that arrive before the run's
  ``started`` event (they travel on other topics) are recorded here and acted upon as soon
  as the shape is known.

Node statuses: ``pending`` (released), ``running``, ``failed`` (an attempt failed, a retry may
come: only the scheduler knows, and it says ``dead`` on the DLQ when none will), ``blocked``
(put back by a repair) and the terminal ones (``duetime.core.states.TERMINAL``): ``success``,
``dead``, ``skipped``, and ``cancelled`` (the member's scheduler says so with a
``node_cancelled`` event when the job is cancelled while the run is going: its descendants
are skipped and the run ends ``cancelled``). A terminal status never changes, except by a
repair.

Repair (:func:`on_retry`, from a ``retry`` DagRunEvent: the API, the SDK, or the scheduler of a
member whose dead letter was replayed): ``duetime.core.dag.repair_plan`` names the dead nodes
to run again and the skipped ones to put back to blocked; the dead ones are released again
(reason ``repair``: the scheduler releases a dead or skipped member only for a repair), the
run is reopened (``reopened`` event for the projection) and goes on as any run. A request is
applied once (its ``request_id`` is remembered); a request for a run with nothing to repair
(already being repaired, or a success) changes nothing.

Releases and skips are decided by ``duetime.core.dag`` (:func:`ready_to_release`,
:func:`to_skip`, :func:`run_outcome`): the functions its property tests check.

Idempotence (the resolver runs at-least-once): what an event implies is derived from the
progress *after* the event, whether or not the event changed anything. A redelivered event
therefore sends again the releases, skips and completion it implied, in case the crash that
caused the redelivery lost them; the scheduler ignores a second release or skip of a job in
the same run, and a completion carries the run's id. Without redelivery nothing is sent twice:
a node is released by the success of its last upstream only.

A repair is the one move backwards (dead to pending), so a redelivery must not undo it. The
progress table and the input offsets are not written atomically: a successor restores a
run's progress from the changelog, possibly past the repair, and then reads again events
from before it. The dead letter of the execution the repair replaced would kill the node
again and skip its descendants; so the progress remembers which execution made each node
dead (``dead``), a repair moves those ids to ``superseded``, and an event of a superseded
execution changes nothing (each repair's release is a new execution, with a new id).
"""

from __future__ import annotations

import uuid
from collections.abc import Container, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from duetime.core.dag import REPAIR_REASON, ready_to_release, repair_plan, run_outcome, to_skip
from duetime.core.models import ControlKind, DagRunEventKind, DagRunStatus, Status
from duetime.core.records import ControlCommand, DagRunEvent
from duetime.core.states import TERMINAL

Kids = Mapping[str, Sequence[str]]
"""A shape's child map (``duetime.core.dag.children`` of its nodes), computed by the caller."""

STARTED = frozenset({Status.RUNNING, Status.FAILED})
"""A released node that a worker has picked up: releasing it again is pointless."""
_NOT_RELEASABLE = TERMINAL | STARTED
_SUCCEEDED = frozenset({Status.SUCCESS})

_COMMAND_NS = uuid.UUID("a3c6c1c4-8b4e-4f0e-b3a0-57d3d3f2c6a1")

NodeEvent = Literal[
    Status.RUNNING, Status.FAILED, Status.SUCCESS, Status.DEAD, Status.CANCELLED, Status.EXPIRED
]
_ENDS_BADLY = frozenset({Status.DEAD, Status.CANCELLED, Status.EXPIRED})
"""A node status that skips every descendant in this run."""

REQUESTS_KEPT = 20
"""Repair request ids remembered per run (a redelivery comes within seconds)."""

SUPERSEDED_KEPT = 1_000
"""Ids of the executions repairs replaced, remembered per run (newest kept)."""


@dataclass
class Actions:
    """What one event asks the resolver to write."""

    commands: list[ControlCommand] = field(default_factory=list)
    """ControlCommands (release, skip, dag_run_end), for the control topic (key job_id)."""
    events: list[DagRunEvent] = field(default_factory=list)
    """DagRunEvents (node_status, completed), for the dag_runs topic (key dag_id)."""
    progress_changed: bool = False


# --- records -------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True, kw_only=True)
class Shape:
    """A run's nodes as they were when it started (never changes)."""

    dag_id: str
    trigger_job_id: str | None
    started_at_ms: int
    nodes: dict[str, list[str]]
    """key → the keys it depends on."""
    job_ids: dict[str, str]
    """key → the node's job id."""

    @classmethod
    def of(cls, started: DagRunEvent) -> Shape:
        """A run's shape from its ``started`` DagRunEvent."""
        return cls(
            dag_id=started.dag_id,
            trigger_job_id=started.trigger_job_id,
            started_at_ms=started.at_ms,
            nodes={n.key: list(n.depends_on) for n in started.nodes},
            job_ids={n.key: n.job_id for n in started.nodes},
        )

    def to_table(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_table(cls, data: Mapping[str, Any]) -> Shape:
        return cls(**data)


@dataclass(slots=True, kw_only=True)
class Progress:
    """A run's progress (mutable: the transform edits a fresh copy of the table's entry)."""

    run_id: str
    dag_id: str | None
    statuses: dict[str, Status] = field(default_factory=dict)
    done: DagRunStatus | None = None
    """The run's outcome once every node is terminal (success or failed)."""
    trigger_job_id: str | None = None
    seen_at_ms: int
    ended_at_ms: int | None = None
    partition: int | None = None
    """The by_run partition whose sweep may drop it (set by the app)."""
    repairs: list[str] = field(default_factory=list)
    """The ids of the repair requests applied, oldest first (at most ``REQUESTS_KEPT``)."""
    dead: dict[str, str] = field(default_factory=dict)
    """key → the id of the execution whose dead letter made the node dead."""
    superseded: list[str] = field(default_factory=list)
    """The ids of the dead executions a repair ran again, oldest first (at most
    ``SUPERSEDED_KEPT``): a redelivered event of one changes nothing (module docstring)."""

    def to_table(self) -> dict[str, Any]:
        """Plain strings for the enums: the table's JSON serializer need not know them.
        ``repairs``, ``dead`` and ``superseded`` only once they hold something: an unrepaired
        run's entry keeps the format that earlier builds wrote (and read)."""
        data = {
            **asdict(self),
            "statuses": {key: status.value for key, status in self.statuses.items()},
            "done": None if self.done is None else self.done.value,
        }
        for name in _OMITTED_WHEN_EMPTY:
            if not data[name]:
                del data[name]
        return data

    @classmethod
    def from_table(cls, data: Mapping[str, Any]) -> Progress:
        """Back from the table's JSON (enums come back as strings)."""
        values = dict(data)
        statuses = values.pop("statuses", None) or {}
        done = values.pop("done", None)
        return cls(
            statuses={key: Status(status) for key, status in statuses.items()},
            done=None if done is None else DagRunStatus(done),
            # copies: the transform edits these in place, never the table's entry
            dead=dict(values.pop("dead", None) or {}),
            superseded=list(values.pop("superseded", None) or []),
            **values,
        )


_OMITTED_WHEN_EMPTY = ("repairs", "dead", "superseded")


def new_progress(run_id: str, dag_id: str | None, now_ms: int) -> Progress:
    return Progress(run_id=run_id, dag_id=dag_id, seen_at_ms=now_ms)


# --- events --------------------------------------------------------------------------------


def on_started(progress: Progress, shape: Shape | None, kids: Kids, now_ms: int) -> Actions:
    """The run's shape became known: act on everything heard before it (usually nothing).

    ``shape`` is None only for a redelivered started event of a run already finished.
    """
    out = Actions()
    if progress.done is not None or shape is None:
        _completion(progress, now_ms, out)
        return out
    progress.dag_id = shape.dag_id
    statuses = progress.statuses
    for key in [k for k in statuses if k not in shape.nodes]:
        del statuses[key]  # not a node of this run (cannot happen with well-formed events)
    for key, status in list(statuses.items()):
        if status == Status.SUCCESS:
            _release_children(progress, shape, kids, key, now_ms, out)
        elif status in _ENDS_BADLY:
            _skip_descendants(progress, shape, kids, key, now_ms, out)
    _maybe_complete(progress, shape, now_ms, out)
    out.progress_changed = True
    return out


def on_node(
    progress: Progress,
    shape: Shape | None,
    kids: Kids | None,
    key: str,
    status: NodeEvent,
    now_ms: int,
    execution_id: str | None = None,
) -> Actions:
    """A node's result (running, failed, success) or its dead letter (dead), of the execution
    ``execution_id`` (None: an event that names none, a member's cancellation).

    ``shape`` and ``kids`` are None while the run's started event has not been seen.
    """
    out = Actions()
    if execution_id is not None and execution_id in progress.superseded:
        return out  # a redelivered event of an execution a repair ran again: stale
    if progress.done is not None:
        # a redelivered event of a finished run: say again how it ended, change nothing
        _completion(progress, now_ms, out)
        return out
    if shape is not None and key not in shape.nodes:
        return out
    statuses = progress.statuses
    current = statuses.get(key)
    if current in TERMINAL and current != status:
        return out  # terminal statuses do not change (e.g. a late "running" after success)
    if current != status:
        statuses[key] = status
        out.progress_changed = True
    if (
        status == Status.DEAD
        and execution_id is not None
        and progress.dead.get(key) != execution_id
    ):
        progress.dead[key] = execution_id
        out.progress_changed = True
    if shape is None or kids is None:
        return out  # remembered until the run's started event arrives
    out.events.append(_node_event(shape, progress, key, status, now_ms))
    if status == Status.SUCCESS:
        _release_children(progress, shape, kids, key, now_ms, out)
    elif status in _ENDS_BADLY:
        _skip_descendants(progress, shape, kids, key, now_ms, out)
    if status in TERMINAL:
        _maybe_complete(progress, shape, now_ms, out)
    return out


def on_retry(
    progress: Progress,
    shape: Shape | None,
    kids: Kids,
    request_id: str,
    only: str | None,
    now_ms: int,
    replayed: Replayed | None = None,
) -> Actions:
    """A request to repair the run: re-run its dead nodes (``only``: just that one), put their
    skipped descendants back to blocked, reopen the run if it had ended.

    ``shape`` is None for a run this resolver does not hold (never started, succeeded, or
    swept after ``repair_retention_s``): nothing to repair. A member's replay (``replayed``)
    is then handed back to its scheduler as a plain replay, outside the run, as before runs
    could be repaired: a replay is never swallowed. A redelivered request (its id is
    remembered) sends again the releases of the nodes still pending, and changes nothing.
    """
    out = Actions()
    if shape is None:
        if replayed is not None:
            out.commands.append(_plain_replay(progress, replayed, now_ms))
        return out
    if request_id in progress.repairs:
        for key in sorted(k for k, s in progress.statuses.items() if s == Status.PENDING):
            out.commands.append(_command(progress, shape, key, ControlKind.RELEASE, now_ms))
        return out
    progress.repairs = [*progress.repairs, request_id][-REQUESTS_KEPT:]
    out.progress_changed = True
    plan = repair_plan(
        shape.nodes, progress.statuses, None if only is None else {only}, child_map=kids
    )
    if not plan:
        return out  # nothing dead: a run already being repaired, or one that succeeded
    statuses = progress.statuses
    superseded = progress.superseded
    for key in plan.rerun:
        dead_id = progress.dead.pop(key, None)
        if dead_id is not None:
            superseded.append(dead_id)
        statuses[key] = Status.PENDING
        out.commands.append(_command(progress, shape, key, ControlKind.RELEASE, now_ms))
        out.events.append(_node_event(shape, progress, key, Status.PENDING, now_ms))
    del superseded[:-SUPERSEDED_KEPT]
    for key in plan.reblock:
        statuses[key] = Status.BLOCKED
        out.events.append(_node_event(shape, progress, key, Status.BLOCKED, now_ms))
    if progress.done is not None:
        progress.done = None
        progress.ended_at_ms = None
        out.events.insert(
            0,
            DagRunEvent(
                dag_id=shape.dag_id,
                dag_run_id=progress.run_id,
                kind=DagRunEventKind.REOPENED,
                at_ms=now_ms,
                status=DagRunStatus.RUNNING,
                node_statuses=dict(statuses),
                request_id=request_id,
            ),
        )
    return out


@dataclass(frozen=True, slots=True)
class Replayed:
    """The dead execution whose replay asked for a repair (a member's scheduler sent it)."""

    job_id: str
    execution_id: str


REPLAY_PREFIX = "replay/"
"""The request id a member's scheduler gives the repair its replay asks for:
``replay/<dead execution id>`` (one repair per dead execution)."""


def _plain_replay(progress: Progress, replayed: Replayed, now_ms: int) -> ControlCommand:
    job_id = replayed.job_id
    return ControlCommand(
        command_id=_command_id(progress.run_id, job_id, ControlKind.REPLAY),
        job_id=job_id,
        kind=ControlKind.REPLAY,
        issued_at_ms=now_ms,
        execution_id=replayed.execution_id,
        reason="the run is no longer held by the resolver: replayed outside it",
        requested_by="resolver",
    )


# --- what follows from a status ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _HasStatus(Container[str]):
    """The keys whose status is one of ``wanted``: a set as ``dag.ready_to_release`` reads
    it, without building one per event (O(children) instead of O(nodes))."""

    statuses: Mapping[str, Status]
    wanted: frozenset[Status]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.statuses.get(key) in self.wanted


def _release_children(
    progress: Progress, shape: Shape, kids: Kids, key: str, now_ms: int, out: Actions
) -> None:
    statuses = progress.statuses
    # a pending child is released again (a resend: see the module's idempotence note)
    ready = ready_to_release(
        shape.nodes,
        _HasStatus(statuses, _SUCCEEDED),
        key,
        _HasStatus(statuses, _NOT_RELEASABLE),
        child_map=kids,
    )
    for child in ready:
        out.commands.append(_command(progress, shape, child, ControlKind.RELEASE, now_ms))
        if statuses.get(child) != Status.PENDING:
            statuses[child] = Status.PENDING
            out.progress_changed = True
            out.events.append(_node_event(shape, progress, child, Status.PENDING, now_ms))


def _skip_descendants(
    progress: Progress, shape: Shape, kids: Kids, key: str, now_ms: int, out: Actions
) -> None:
    statuses = progress.statuses
    for node in sorted(to_skip(shape.nodes, key, child_map=kids)):
        current = statuses.get(node)
        if current in TERMINAL and current != Status.SKIPPED:
            continue  # ended on its own (cancelled; success or dead cannot happen: a
            # descendant of a dead node never ran in this run)
        out.commands.append(_command(progress, shape, node, ControlKind.SKIP, now_ms))
        if current != Status.SKIPPED:
            statuses[node] = Status.SKIPPED
            out.progress_changed = True
            out.events.append(_node_event(shape, progress, node, Status.SKIPPED, now_ms))


def _maybe_complete(progress: Progress, shape: Shape, now_ms: int, out: Actions) -> None:
    outcome = run_outcome(shape.nodes, progress.statuses)
    if outcome is None:
        return
    progress.done = outcome
    progress.trigger_job_id = shape.trigger_job_id
    progress.ended_at_ms = now_ms
    out.progress_changed = True
    _completion(progress, now_ms, out)


def _completion(progress: Progress, now_ms: int, out: Actions) -> None:
    outcome, dag_id = progress.done, progress.dag_id
    if dag_id is None:
        # cannot happen: a run ends only after its started event, which names its DAG
        raise ValueError(f"DAG run {progress.run_id} has no dag_id")
    out.events.append(
        DagRunEvent(
            dag_id=dag_id,
            dag_run_id=progress.run_id,
            kind=DagRunEventKind.COMPLETED,
            at_ms=now_ms,
            status=outcome,
            node_statuses=dict(progress.statuses),
        )
    )
    trigger_job_id = progress.trigger_job_id
    if trigger_job_id:
        # the DAG's trigger job counts live runs for its overlap policy
        out.commands.append(
            ControlCommand(
                command_id=_command_id(
                    progress.run_id, trigger_job_id, ControlKind.DAG_RUN_END, len(progress.repairs)
                ),
                job_id=trigger_job_id,
                kind=ControlKind.DAG_RUN_END,
                issued_at_ms=now_ms,
                dag_id=dag_id,
                dag_run_id=progress.run_id,
                reason=outcome,
                requested_by="resolver",
            )
        )


# --- retention -----------------------------------------------------------------------------


def expired(
    progress: Progress,
    has_shape: bool,
    now_ms: int,
    done_retention_ms: int,
    orphan_retention_ms: int,
    repair_retention_ms: int | None = None,
) -> bool:
    """Whether a run's entries may be dropped from the tables.

    A finished run is kept ``done_retention_ms`` after it ended (long enough for any redelivery
    to find it finished, which is seconds), or ``repair_retention_ms`` if it still has its
    shape (it did not succeed: it may be repaired); events of a run whose ``started`` never came are
    kept ``orphan_retention_ms``. A run that started and has not finished is never dropped.
    """
    if progress.done is not None:
        kept_ms = done_retention_ms
        if has_shape and repair_retention_ms is not None:
            kept_ms = max(done_retention_ms, repair_retention_ms)
        return now_ms - (progress.ended_at_ms or now_ms) > kept_ms
    return not has_shape and now_ms - progress.seen_at_ms > orphan_retention_ms


# --- helpers -------------------------------------------------------------------------------


def _command_id(run_id: str, job_id: str, kind: ControlKind, repairs: int = 0) -> str:
    """Deterministic: a resent command has the id of the first one (and a command of the
    n-th repair of a run differs from the first run's)."""
    suffix = f"/repair-{repairs}" if repairs else ""
    return str(uuid.uuid5(_COMMAND_NS, f"{run_id}/{job_id}/{kind.value}{suffix}"))


def _command(
    progress: Progress, shape: Shape, key: str, kind: ControlKind, now_ms: int
) -> ControlCommand:
    job_id = shape.job_ids[key]
    repairs = len(progress.repairs)
    return ControlCommand(
        command_id=_command_id(progress.run_id, job_id, kind, repairs),
        job_id=job_id,
        kind=kind,
        issued_at_ms=now_ms,
        dag_id=shape.dag_id,
        dag_run_id=progress.run_id,
        # after a repair, a release may find the member's run entry dead or skipped
        reason=REPAIR_REASON if repairs and kind is ControlKind.RELEASE else None,
        requested_by="resolver",
    )


def _node_event(
    shape: Shape, progress: Progress, key: str, status: Status, now_ms: int
) -> DagRunEvent:
    return DagRunEvent(
        dag_id=shape.dag_id,
        dag_run_id=progress.run_id,
        kind=DagRunEventKind.NODE_STATUS,
        at_ms=now_ms,
        status=DagRunStatus.RUNNING,
        node_key=key,
        node_status=status,
    )
