"""DAG validation and resolution: pure functions over ``key -> depends_on`` mappings.

Role: the producers call :func:`validate_dag` / :func:`validate_dag_pairs` before anything
reaches Kafka, so a bad DAG gets a clear 4xx and writes nothing; the DAG resolver
(``consumers/resolver/progress.py``) calls :func:`ready_to_release`, :func:`to_skip` and
:func:`run_outcome` as results arrive, and :func:`repair_plan` when a run is repaired (its
dead nodes run again, their skipped descendants go back to blocked).

A DAG is a mapping from a job key to the keys it depends on (its *upstreams*). An edge
``a → b`` means "b depends on a": b is released only when every upstream succeeded in the
same DAG run, and an upstream that ends ``dead`` marks every descendant ``skipped``.

Guarantees:

- Pure: no clock, no randomness, no I/O; inputs are never mutated.
- Deterministic: the topological order is Kahn's algorithm taking the smallest ready key
  first, so the same DAG always gives the same order; a reported cycle always starts at
  its smallest key.
- Iterative: no recursion anywhere, so a 10,000-node chain is as safe as a flat DAG.
- Complexity (V nodes, E edges): validation is O((V + E) log V) (the heap of ready keys);
  :func:`children`, :func:`descendants`, :func:`to_skip` and :func:`run_outcome` are
  O(V + E), :func:`repair_plan` O(V log V + E). :func:`ready_to_release` is O(V + E) to
  build the child map, or O(children · their upstreams) when the caller passes a
  precomputed ``child_map`` (the resolver should compute :func:`children` once per DAG and
  reuse it).

Every function except the validators assumes its input already passed validation.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from duetime.core.errors import DagCycleError, ValidationError
from duetime.core.models import DagRunStatus, Status
from duetime.core.states import TERMINAL

DEFAULT_MAX_NODES = 10_000
MAX_KEY_LEN = 200
_KEY_RE = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_KEY_LEN}}}")
_LIST_IN_MESSAGE = 10  # names shown in an error message; details carry them all

Nodes = Mapping[str, Sequence[str]]


def _show(names: Iterable[str]) -> str:
    listed = list(names)
    head = ", ".join(repr(n) for n in listed[:_LIST_IN_MESSAGE])
    more = len(listed) - _LIST_IN_MESSAGE
    return head + (f" and {more} more" if more > 0 else "")


def _check_key(key: object, *, field: str) -> None:
    if not isinstance(key, str) or _KEY_RE.fullmatch(key) is None:
        raise ValidationError(
            f"invalid job key {key!r}: a key is 1 to {MAX_KEY_LEN} characters of "
            "letters, digits, '_', '.' and '-'",
            field=field,
            details={"key": key if isinstance(key, str) else repr(key)},
        )


def validate_dag_pairs(
    pairs: Iterable[tuple[str, Sequence[str]]], *, max_nodes: int = DEFAULT_MAX_NODES
) -> list[str]:
    """Validate a DAG given as ``(key, depends_on)`` pairs, as the API receives it.

    Same checks as :func:`validate_dag`, plus duplicate keys (which a mapping cannot hold).
    Returns the topological order.
    """
    items = list(pairs)
    if len(items) > max_nodes:
        raise ValidationError(
            f"a DAG may have at most {max_nodes} jobs, got {len(items)}",
            field="jobs",
            details={"limit": max_nodes, "count": len(items)},
        )
    nodes: dict[str, Sequence[str]] = {}
    duplicates: list[str] = []
    for key, deps in items:
        _check_key(key, field="key")
        if key in nodes:
            if key not in duplicates:
                duplicates.append(key)
            continue
        nodes[key] = deps
    if duplicates:
        raise ValidationError(
            f"duplicate job keys in the DAG: {_show(duplicates)}",
            field="key",
            details={"duplicates": duplicates},
        )
    return validate_dag(nodes, max_nodes=max_nodes)


def validate_dag(nodes: Nodes, *, max_nodes: int = DEFAULT_MAX_NODES) -> list[str]:
    """Check a DAG and return its topological order (upstreams before dependants).

    Raises :class:`ValidationError` for an empty DAG, more than ``max_nodes`` jobs, a bad
    key, a ``depends_on`` that is not a list of keys or names a key twice, or unknown
    upstream keys; :class:`DagCycleError` (a ValidationError) for a self-loop or a cycle,
    with ``details["cycle"]`` the path along the edges, first node repeated at the end
    (``["a", "b", "a"]``: b depends on a and a depends on b).
    """
    if not nodes:
        raise ValidationError("a DAG needs at least one job", field="jobs")
    if len(nodes) > max_nodes:
        raise ValidationError(
            f"a DAG may have at most {max_nodes} jobs, got {len(nodes)}",
            field="jobs",
            details={"limit": max_nodes, "count": len(nodes)},
        )
    unknown: dict[str, list[str]] = {}  # missing upstream -> the jobs that name it
    for key, deps in nodes.items():
        _check_key(key, field="key")
        if isinstance(deps, str | bytes) or not isinstance(deps, Sequence):
            raise ValidationError(
                f"depends_on of job {key!r} must be a list of job keys",
                field="depends_on",
                details={"key": key},
            )
        seen: set[str] = set()
        for dep in deps:
            if not isinstance(dep, str):
                raise ValidationError(
                    f"depends_on of job {key!r} holds {dep!r}, which is not a job key",
                    field="depends_on",
                    details={"key": key},
                )
            if dep == key:
                raise DagCycleError(
                    f"job {key!r} depends on itself: {key} → {key}",
                    field="depends_on",
                    details={"key": key, "cycle": [key, key]},
                )
            if dep in seen:
                raise ValidationError(
                    f"job {key!r} lists upstream {dep!r} more than once",
                    field="depends_on",
                    details={"key": key, "upstream": dep},
                )
            seen.add(dep)
            if dep not in nodes:
                unknown.setdefault(dep, []).append(key)
    if unknown:
        missing = sorted(unknown)
        raise ValidationError(
            f"unknown upstream job keys: {_show(missing)}",
            field="depends_on",
            details={"unknown": missing, "referenced_by": {m: unknown[m] for m in missing}},
        )
    return _topological_order(nodes)


def _topological_order(nodes: Nodes) -> list[str]:
    indegree = {key: len(deps) for key, deps in nodes.items()}
    child_map = children(nodes)
    ready = [key for key, n in indegree.items() if n == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        key = heapq.heappop(ready)
        order.append(key)
        for child in child_map[key]:
            indegree[child] -= 1
            if indegree[child] == 0:
                heapq.heappush(ready, child)
    if len(order) == len(nodes):
        return order
    cycle = _find_cycle(nodes, {key for key, n in indegree.items() if n > 0})
    raise DagCycleError(
        "dependency cycle: " + " → ".join(cycle), field="depends_on", details={"cycle": cycle}
    )


def _find_cycle(nodes: Nodes, stuck: set[str]) -> list[str]:
    """A cycle among the keys Kahn's algorithm could not order.

    Every stuck key still has an upstream that is stuck, so walking upstream from any of
    them must revisit a key within ``len(stuck)`` steps; the revisited stretch is a cycle.
    """
    walk: list[str] = []
    position: dict[str, int] = {}
    key = min(stuck)
    while key not in position:
        position[key] = len(walk)
        walk.append(key)
        key = min(dep for dep in nodes[key] if dep in stuck)
    upstream_walk = walk[position[key] :]
    cycle = upstream_walk[::-1]  # walked against the edges; report along them
    start = cycle.index(min(cycle))
    cycle = cycle[start:] + cycle[:start]
    return [*cycle, cycle[0]]


def roots(nodes: Nodes) -> list[str]:
    """The keys with no upstream, sorted: what a DAG run releases first. O(V)."""
    return sorted(key for key, deps in nodes.items() if not deps)


def children(nodes: Nodes) -> dict[str, list[str]]:
    """Invert the DAG: every key maps to its direct dependants, sorted. O(V + E)."""
    result: dict[str, list[str]] = {key: [] for key in nodes}
    for key in sorted(nodes):
        for dep in nodes[key]:
            result.setdefault(dep, []).append(key)
    return result


def descendants(
    nodes: Nodes, key: str, *, child_map: Mapping[str, Sequence[str]] | None = None
) -> set[str]:
    """Every key reachable from ``key`` along the edges, ``key`` itself excluded. O(V + E)."""
    if key not in nodes:
        raise KeyError(f"job {key!r} is not in the DAG")
    kids = children(nodes) if child_map is None else child_map
    found: set[str] = set()
    stack = list(kids.get(key, ()))
    while stack:
        node = stack.pop()
        if node in found:
            continue
        found.add(node)
        stack.extend(kids.get(node, ()))
    return found


def ready_to_release(
    nodes: Nodes,
    succeeded: Container[str],
    just_succeeded: str,
    released: Container[str],
    *,
    child_map: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """The dependants of ``just_succeeded`` to release now, sorted.

    A child is ready when every one of its upstreams is in ``succeeded`` (``just_succeeded``
    counts even if the caller has not added it yet) and it is not in ``released``. Only the
    children of ``just_succeeded`` are considered: a node becomes ready at the moment its
    last upstream succeeds, so each node is reported by exactly one upstream's success.
    ``succeeded`` and ``released`` are only asked ``key in ...`` (the resolver passes views
    of a run's statuses rather than building sets).
    """
    if just_succeeded not in nodes:
        raise KeyError(f"job {just_succeeded!r} is not in the DAG")
    kids = children(nodes) if child_map is None else child_map
    ready = [
        child
        for child in kids.get(just_succeeded, ())
        if child not in released
        and all(dep in succeeded or dep == just_succeeded for dep in nodes[child])
    ]
    return sorted(ready)


def to_skip(
    nodes: Nodes, dead: str, *, child_map: Mapping[str, Sequence[str]] | None = None
) -> set[str]:
    """Every descendant of the ``dead`` node: none of them can run in this DAG run."""
    return descendants(nodes, dead, child_map=child_map)


def run_outcome(nodes: Nodes, statuses: Mapping[str, str]) -> DagRunStatus | None:
    """The outcome of a DAG run, or None while it is still going. O(V).

    None while some node is not terminal (``duetime.core.states.TERMINAL``; a node missing
    from ``statuses`` is pending; "failed" is not terminal: a retry may come); ``success``
    when every node succeeded; ``cancelled`` when every node is terminal and at least one was
    cancelled (its job was: the run cannot be repaired, so it must not read as merely
    failed); ``failed`` when every node is terminal and at least one is dead, expired or
    skipped.
    """
    all_succeeded = True
    any_cancelled = False
    for key in nodes:
        status = statuses.get(key)
        if status is None or status not in TERMINAL:
            return None
        if status != Status.SUCCESS:
            all_succeeded = False
            any_cancelled = any_cancelled or status == Status.CANCELLED
    if all_succeeded:
        return DagRunStatus.SUCCESS
    return DagRunStatus.CANCELLED if any_cancelled else DagRunStatus.FAILED


REPAIR_REASON = "repair"
"""``reason`` of the resolver's release of a member in a repaired run: the scheduler releases
a member whose entry for the run is dead or skipped only with it, so that a stale release
from before the repair (a redelivery) cannot run a dead node again by itself."""

REPAIRABLE: frozenset[Status] = frozenset({Status.DEAD, Status.EXPIRED})
"""Node statuses a repair runs again: the node ran (or was due) and ended without success.
``cancelled`` is not: a cancelled job runs no more, in any run."""


@dataclass(frozen=True, slots=True)
class RepairPlan:
    """What a repair of a DAG run changes: both lists sorted, disjoint."""

    rerun: list[str]
    """Dead (or expired) nodes whose upstreams all succeeded: released again now."""
    reblock: list[str]
    """Skipped descendants of ``rerun`` that nothing else still dooms: back to blocked, to be
    released as their upstreams succeed."""

    def __bool__(self) -> bool:
        return bool(self.rerun)


def repair_plan(
    nodes: Nodes,
    statuses: Mapping[str, str],
    only: Container[str] | None = None,
    *,
    child_map: Mapping[str, Sequence[str]] | None = None,
) -> RepairPlan:
    """Which nodes a repair of a run re-runs and which it puts back to blocked. O(V + E).

    ``only``: repair only these nodes (a replay of one member's dead letter); None: every
    repairable node. A node is re-run when its status is in :data:`REPAIRABLE` and all its
    upstreams succeeded (a dead node always ran, so they did; anything else is left alone).
    A skipped node goes back to blocked when it descends from a re-run node and from no node
    that stays dead, expired or cancelled (those would skip it again at once). An empty plan
    (falsy) changes nothing: a run already being repaired has no dead node left to re-run.
    """
    kids = children(nodes) if child_map is None else child_map
    rerun: list[str] = []
    doomed: list[str] = []  # nodes that stay ended without success: they keep skipping
    for key in sorted(nodes):
        status = statuses.get(key)
        wanted = status in REPAIRABLE and (only is None or key in only)
        if wanted and all(statuses.get(dep) == Status.SUCCESS for dep in nodes[key]):
            rerun.append(key)
            continue
        if status in REPAIRABLE or status == Status.CANCELLED:
            doomed.append(key)
    still_skipped = _reach(doomed, kids)
    reopened = _reach(rerun, kids)
    reblock = sorted(
        key for key in reopened if statuses.get(key) == Status.SKIPPED and key not in still_skipped
    )
    return RepairPlan(rerun=rerun, reblock=reblock)


def _reach(sources: Iterable[str], kids: Mapping[str, Sequence[str]]) -> set[str]:
    """Every key reachable from any of ``sources`` along the edges, sources excluded unless
    reachable from another: one walk for all of them, O(V + E)."""
    found: set[str] = set()
    stack = [child for key in sources for child in kids.get(key, ())]
    while stack:
        node = stack.pop()
        if node not in found:
            found.add(node)
            stack.extend(kids.get(node, ()))
    return found
