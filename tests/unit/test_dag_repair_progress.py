"""The resolver's repair of a DAG run and its handling of a cancelled member (pure transform:
``consumers/resolver/progress.py``), driven as the app drives it."""

from __future__ import annotations

import itertools
import json
from typing import TypeAlias, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.consumers.resolver import progress as p
from duetime.core.dag import REPAIR_REASON, children
from duetime.core.models import ControlKind, DagRunEventKind, DagRunStatus, Status
from tests.unit.test_dag import dags
from tests.unit.test_dag_resolver_progress import DIAMOND, Run, commands

CHAIN = {"a": [], "b": ["a"], "c": ["b"]}


def retry(run: Run, request_id: str = "req-1", only: str | None = None) -> p.Actions:
    kids = children(run.nodes)
    return run._keep(p.on_retry(run.progress, run.shape, kids, request_id, only, 2))


def failed_chain() -> Run:
    run = Run(CHAIN)
    run.node("a", Status.DEAD)
    assert run.progress.done is DagRunStatus.FAILED
    return run


def test_retry_of_a_failed_chain_reruns_the_head_and_reblocks_the_rest() -> None:
    run = failed_chain()
    out = retry(run)
    [release] = out.commands
    assert (release.kind, release.job_id, release.reason) == ("release", "job-a", REPAIR_REASON)
    kinds = [(e.kind, e.node_key, e.node_status) for e in out.events]
    assert kinds[0][0] == DagRunEventKind.REOPENED
    assert out.events[0].status is DagRunStatus.RUNNING
    assert out.events[0].node_statuses == {"a": "pending", "b": "blocked", "c": "blocked"}
    assert kinds[1:] == [
        ("node_status", "a", "pending"),
        ("node_status", "b", "blocked"),
        ("node_status", "c", "blocked"),
    ]
    assert run.progress.done is None and run.progress.ended_at_ms is None
    # the repair goes on as any run: releases carry the repair's reason, the end is success
    assert commands(run.node("a", Status.SUCCESS), "release") == ["b"]
    assert run.sent[-1].commands[0].reason == REPAIR_REASON
    run.node("b", Status.SUCCESS)
    done = run.node("c", Status.SUCCESS)
    [completed] = [e for e in done.events if e.kind == "completed"]
    assert completed.status == "success"
    [end] = [c for c in done.commands if c.kind == "dag_run_end"]
    assert end.reason == "success"


def test_repair_commands_differ_from_the_first_runs() -> None:
    run = Run(CHAIN)
    first = {c.command_id for c in run.node("a", Status.SUCCESS).commands}  # b's release
    run.node("b", Status.DEAD)
    again = {c.command_id for c in retry(run).commands}
    assert first and again and not first & again


def test_a_second_request_while_repairing_does_nothing_new() -> None:
    run = failed_chain()
    retry(run, "req-1")
    second = retry(run, "req-2")
    assert second.commands == [] and second.events == []
    assert run.progress.statuses == {"a": "pending", "b": "blocked", "c": "blocked"}


def test_a_redelivered_request_resends_the_pending_releases_only() -> None:
    run = failed_chain()
    first = retry(run, "req-1")
    again = retry(run, "req-1")
    assert [c.command_id for c in again.commands] == [c.command_id for c in first.commands]
    assert again.events == [] and not again.progress_changed
    # once the node died again, the same request (redelivered) does not repair a second time
    run.node("a", Status.RUNNING)
    run.node("a", Status.DEAD)
    late = retry(run, "req-1")
    assert late.commands == [] and late.events == []
    assert run.progress.done is DagRunStatus.FAILED
    # a new request does
    assert commands(retry(run, "req-3"), "release") == ["a"]


def test_a_succeeded_run_and_an_unknown_run_are_left_alone() -> None:
    run = Run({"a": []})
    run.node("a", Status.SUCCESS)
    out = retry(run)
    assert out.commands == [] and out.events == []
    assert run.progress.done is DagRunStatus.SUCCESS
    unknown = p.on_retry(p.new_progress("r9", "dag", 0), None, {}, "req", None, 1)
    assert unknown.commands == [] and unknown.events == [] and not unknown.progress_changed


def test_a_replay_for_a_run_no_longer_held_is_handed_back_as_a_plain_replay() -> None:
    """A member's replay must never be swallowed: past the resolver's repair retention (or
    for a run it never held) the member runs alone, as before runs could be repaired."""
    replayed = p.Replayed(job_id="job-b", execution_id="dead-1")
    out = p.on_retry(p.new_progress("r9", "dag", 0), None, {}, "replay/dead-1", "b", 5, replayed)
    [command] = out.commands
    assert (command.kind, command.job_id, command.execution_id) == ("replay", "job-b", "dead-1")
    assert command.dag_run_id is None  # outside the run
    assert out.events == []
    again = p.on_retry(p.new_progress("r9", "dag", 0), None, {}, "replay/dead-1", "b", 6, replayed)
    assert [c.command_id for c in again.commands] == [command.command_id]  # the same command


def test_a_replay_repairs_only_its_node() -> None:
    run = Run(DIAMOND)
    run.node("a", Status.SUCCESS)
    run.node("b", Status.DEAD)
    run.node("c", Status.DEAD)
    assert run.progress.done is DagRunStatus.FAILED
    out = retry(run, "replay/x", only="b")
    assert commands(out, "release") == ["b"]
    assert run.progress.statuses["d"] == "skipped"  # c is still dead: d cannot run
    run.node("b", Status.SUCCESS)
    assert run.progress.done is DagRunStatus.FAILED  # ended again: c is dead
    out = retry(run, "replay/y", only="c")
    assert commands(out, "release") == ["c"]
    assert run.progress.statuses["d"] == "blocked"
    assert commands(run.node("c", Status.SUCCESS), "release") == ["d"]


def test_a_cancelled_member_skips_its_descendants_and_ends_the_run_cancelled() -> None:
    run = Run(CHAIN)
    run.node("a", Status.SUCCESS)
    out = run.node("b", Status.CANCELLED)
    assert commands(out, "skip") == ["c"]
    [completed] = [e for e in out.events if e.kind == "completed"]
    assert completed.status == DagRunStatus.CANCELLED
    [end] = [c for c in out.commands if c.kind == ControlKind.DAG_RUN_END]
    assert end.reason == "cancelled"
    # a cancelled member is never re-run by a repair
    assert retry(run).commands == []


def test_a_cancelled_event_after_success_changes_nothing() -> None:
    run = Run(CHAIN)
    run.node("a", Status.SUCCESS)
    out = run.node("a", Status.CANCELLED)
    assert out.commands == [] and out.events == []
    assert run.progress.statuses["a"] == "success"


def test_the_table_entry_of_a_repaired_run_survives_json() -> None:
    run = failed_chain()
    retry(run, "req-1")
    stored = json.loads(json.dumps(run.progress.to_table()))
    restored = p.Progress.from_table(stored)
    assert restored.repairs == ["req-1"]
    assert restored.to_table() == run.progress.to_table()


def test_request_ids_are_bounded() -> None:
    run = failed_chain()
    for i in range(p.REQUESTS_KEPT + 5):
        retry(run, f"req-{i}")
    assert len(run.progress.repairs) == p.REQUESTS_KEPT
    assert run.progress.repairs[-1] == f"req-{p.REQUESTS_KEPT + 4}"


def test_a_failed_run_is_kept_for_its_repair_window() -> None:
    run = failed_chain()
    ended = run.progress.ended_at_ms or 0
    hour, week = 3_600_000, 7 * 86_400_000
    assert not p.expired(run.progress, True, ended + 2 * hour, hour, hour, week)
    assert p.expired(run.progress, True, ended + week + 1, hour, hour, week)
    assert p.expired(run.progress, False, ended + 2 * hour, hour, hour, week)


@given(dags(max_size=12), st.data())
def test_any_failed_run_repairs_to_success_when_nothing_fails_again(
    nodes: dict[str, list[str]], data: st.DataObject
) -> None:
    """Play a run through the transform with random deaths, repair it, then let everything
    succeed: the run ends success and each repaired node was released exactly once more."""
    run = Run(nodes)
    dies = set(data.draw(st.lists(st.sampled_from(sorted(nodes)), unique=True)))
    _play(run, nodes, dies)
    assert run.progress.done is not None
    before = dict(run.progress.statuses)
    out = retry(run)
    released = commands(out, "release")
    assert released == sorted(k for k, s in before.items() if s == "dead")
    _play(run, nodes, set())
    assert run.progress.done is DagRunStatus.SUCCESS
    assert all(s == "success" for s in run.progress.statuses.values())


def _play(
    run: Run, nodes: dict[str, list[str]], dies: set[str], log: list[Step] | None = None
) -> None:
    """Drive every released node to its end, as a worker and the scheduler would (roots are
    released by the scheduler when the run starts: the resolver has not heard of them); each
    release is a new execution, whose events ``log`` records."""
    while True:
        statuses = run.progress.statuses
        pending = sorted(
            k for k in nodes if statuses.get(k) == "pending" or (not nodes[k] and k not in statuses)
        )
        if not pending:
            return
        key = pending[0]
        execution_id = f"{key}-{next(_EXECUTIONS)}"
        steps: list[Step] = [
            (key, Status.RUNNING, execution_id),
            (key, Status.DEAD if key in dies else Status.SUCCESS, execution_id),
        ]
        for step in steps:
            _step(run, step)
        if log is not None:
            log.extend(steps)


def test_a_redelivered_dead_letter_of_a_repaired_node_changes_nothing() -> None:
    """A successor restores the progress past the repair and reads the dead letter again
    (found by a resolver SIGKILLed mid-repair): the node stays pending, nothing is skipped."""
    run = Run(CHAIN)
    run.node("a", Status.RUNNING, "x1")
    run.node("a", Status.DEAD, "x1")
    assert run.progress.dead == {"a": "x1"}
    retry(run)
    assert run.progress.superseded == ["x1"] and run.progress.dead == {}
    for status in (Status.RUNNING, Status.FAILED, Status.DEAD):
        again = run.node("a", status, "x1")
        assert again.commands == [] and again.events == [] and not again.progress_changed
    assert run.progress.statuses == {"a": "pending", "b": "blocked", "c": "blocked"}
    assert run.progress.done is None
    # the repair's own execution is another one, and drives the run on
    assert commands(run.node("a", Status.SUCCESS, "x2"), "release") == ["b"]


def test_superseded_executions_are_bounded_and_survive_json() -> None:
    run = Run({"a": []})
    for i in range(p.SUPERSEDED_KEPT + 3):
        run.node("a", Status.DEAD, f"x{i}")
        retry(run, f"req-{i}")
    assert len(run.progress.superseded) == p.SUPERSEDED_KEPT
    assert run.progress.superseded[-1] == f"x{p.SUPERSEDED_KEPT + 2}"
    stored = json.loads(json.dumps(run.progress.to_table()))
    restored = p.Progress.from_table(stored)
    assert restored.to_table() == run.progress.to_table()
    restored.superseded.append("mutated")
    assert "mutated" not in stored["superseded"]  # the table's entry is never edited


_EXECUTIONS = itertools.count()
"""Execution ids: each release of a node is a new execution."""

Step: TypeAlias = tuple[str, Status | None, str]
"""("retry", None, request id), or (node key, status, execution id)."""


@settings(max_examples=150, deadline=None)
@given(dags(max_size=8), st.data())
def test_a_replay_from_any_offset_over_any_restored_progress_ends_as_one_pass(
    nodes: dict[str, list[str]], data: st.DataObject
) -> None:
    """At least once, as a successor sees it: the progress restored from the changelog after
    any prefix of the run's events (k), then every event read again from any earlier offset
    (c <= k), repairs included: the run ends as the one pass did."""
    dies = set(data.draw(st.lists(st.sampled_from(sorted(nodes)), unique=True)))
    log: list[Step] = []
    once = Run(nodes)
    _play(once, nodes, dies, log)
    if once.progress.done is not DagRunStatus.SUCCESS:
        log.append(("retry", None, "req-1"))
        _step(once, log[-1])
        _play(once, nodes, set(), log)
    assert once.progress.done is DagRunStatus.SUCCESS
    k = data.draw(st.integers(0, len(log)), label="restored after")
    c = data.draw(st.integers(0, k), label="read again from")
    run = Run(nodes)
    for step in log[:k]:
        _step(run, step)
    run.progress = p.Progress.from_table(json.loads(json.dumps(run.progress.to_table())))
    run.start()  # the started event is read again too
    for step in log[c:]:
        _step(run, step)
    assert run.progress.statuses == once.progress.statuses
    assert run.progress.done is DagRunStatus.SUCCESS


def _step(run: Run, step: Step) -> None:
    key, status, ident = step
    if status is None:
        retry(run, ident)
    else:
        run.node(key, cast(p.NodeEvent, status), ident)
