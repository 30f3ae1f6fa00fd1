"""The resolver's pure transform: releases, skips, completion, redelivery, early events."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.consumers.resolver import progress as p
from duetime.core.dag import children
from duetime.core.models import ControlKind, DagRunEventKind, DagRunStatus, Status
from duetime.core.records import DagNode, DagRunEvent

DIAMOND = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}


def started(nodes: dict[str, list[str]], run_id: str = "r1") -> DagRunEvent:
    return DagRunEvent(
        dag_id="dag",
        dag_run_id=run_id,
        kind=DagRunEventKind.STARTED,
        at_ms=0,
        trigger_job_id="trigger",
        nodes=[DagNode(key=k, job_id=f"job-{k}", depends_on=d) for k, d in nodes.items()],
    )


class Run:
    """A run's progress and shape, driven the way the app drives them."""

    def __init__(self, nodes: dict[str, list[str]], *, start: bool = True) -> None:
        self.progress = p.new_progress("r1", "dag", 0)
        self.nodes = nodes
        self.shape: p.Shape | None = None
        self.sent: list[p.Actions] = []
        if start:
            self.start()

    def start(self) -> p.Actions:
        self.shape = p.Shape.of(started(self.nodes))
        return self._keep(p.on_started(self.progress, self.shape, children(self.nodes), 1))

    def node(self, key: str, status: p.NodeEvent, execution_id: str | None = None) -> p.Actions:
        kids = None if self.shape is None else children(self.nodes)
        return self._keep(p.on_node(self.progress, self.shape, kids, key, status, 1, execution_id))

    def _keep(self, actions: p.Actions) -> p.Actions:
        self.sent.append(actions)
        return actions


def commands(actions: p.Actions, kind: str) -> list[str]:
    return sorted(c.job_id.removeprefix("job-") for c in actions.commands if c.kind == kind)


def test_a_diamond_releases_d_once_both_upstreams_succeeded() -> None:
    run = Run(DIAMOND)
    assert commands(run.node("a", Status.SUCCESS), "release") == ["b", "c"]
    assert commands(run.node("b", Status.SUCCESS), "release") == []  # c has not succeeded
    assert commands(run.node("c", Status.SUCCESS), "release") == ["d"]
    done = run.node("d", Status.SUCCESS)
    [completed] = [e for e in done.events if e.kind == "completed"]
    assert completed.status == "success"
    assert completed.node_statuses == dict.fromkeys("abcd", Status.SUCCESS)
    [end] = [c for c in done.commands if c.kind == "dag_run_end"]
    assert end.job_id == "trigger" and end.reason == "success"


def test_a_failed_attempt_changes_nothing_downstream() -> None:
    run = Run(DIAMOND)
    run.node("a", Status.SUCCESS)
    failed = run.node("b", Status.FAILED)
    assert failed.commands == []
    assert [e.node_status for e in failed.events] == ["failed"]
    run.node("c", Status.SUCCESS)
    assert commands(run.node("b", Status.SUCCESS), "release") == ["d"]  # the retry succeeded


def test_a_dead_node_skips_every_descendant_and_fails_the_run() -> None:
    run = Run({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": ["d"]})
    run.node("a", Status.SUCCESS)
    dead = run.node("b", Status.DEAD)
    assert commands(dead, "skip") == ["d", "e"]
    assert run.progress.done is None  # c still runs
    done = run.node("c", Status.SUCCESS)
    assert commands(done, "release") == []  # d is skipped, not released
    [completed] = [e for e in done.events if e.kind == "completed"]
    assert completed.status == "failed"
    assert completed.node_statuses == {
        "a": "success",
        "b": "dead",
        "c": "success",
        "d": "skipped",
        "e": "skipped",
    }


def test_terminal_statuses_do_not_move() -> None:
    run = Run(DIAMOND)
    run.node("a", Status.SUCCESS)
    late = run.node("a", Status.RUNNING)
    assert late.commands == [] and late.events == [] and not late.progress_changed
    assert run.progress.statuses["a"] == "success"


def test_a_redelivered_success_resends_its_releases_and_the_scheduler_dedups() -> None:
    run = Run(DIAMOND)
    run.node("a", Status.SUCCESS)
    again = run.node("a", Status.SUCCESS)  # redelivered after a crash
    assert commands(again, "release") == ["b", "c"]
    assert not again.progress_changed  # nothing new to remember
    ids = {c.command_id for c in run.sent[1].commands} | {c.command_id for c in again.commands}
    assert len(ids) == 2  # the same command ids: a resend, not a new command


def test_a_running_child_is_not_released_again() -> None:
    run = Run(DIAMOND)
    run.node("a", Status.SUCCESS)
    run.node("b", Status.RUNNING)
    assert commands(run.node("a", Status.SUCCESS), "release") == ["c"]


def test_a_finished_run_answers_a_redelivery_with_its_completion_only() -> None:
    run = Run({"a": []})
    run.node("a", Status.SUCCESS)
    again = run.node("a", Status.SUCCESS)
    assert [e.kind for e in again.events] == ["completed"]
    assert [c.kind for c in again.commands] == ["dag_run_end"]


def test_events_before_the_started_event_are_acted_upon_when_it_arrives() -> None:
    run = Run(DIAMOND, start=False)
    early = run.node("a", Status.SUCCESS)
    assert early.commands == [] and early.events == []  # the shape is not known yet
    assert commands(run.start(), "release") == ["b", "c"]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_order_of_results_releases_each_node_once_after_its_upstreams(data: Any) -> None:
    """A random DAG run to the end, with results (and duplicates) in a random order."""
    size = data.draw(st.integers(1, 15))
    nodes: dict[str, list[str]] = {}
    for i in range(size):
        ups = data.draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        nodes[f"n{i}"] = [f"n{u}" for u in sorted(ups)]
    dead = set(data.draw(st.sets(st.sampled_from(sorted(nodes)), max_size=2)))
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    run = Run(nodes)
    queue = [k for k, deps in nodes.items() if not deps]  # roots run at once
    released: list[str] = []
    while queue:
        key = queue.pop(rng.randrange(len(queue)))
        outcome: p.NodeEvent = Status.DEAD if key in dead else Status.SUCCESS
        run.node(key, outcome)
        if rng.random() < 0.3:
            run.node(key, outcome)  # a redelivery
        for actions in run.sent:
            for c in actions.commands:
                if c.kind is ControlKind.RELEASE:
                    child = c.job_id.removeprefix("job-")
                    if child not in released:
                        released.append(child)
                        queue.append(child)
        run.sent.clear()
        for child in released:
            assert all(run.progress.statuses[d] == "success" for d in nodes[child])
    statuses = run.progress.statuses
    assert run.progress.done in ("success", "failed")
    assert set(statuses) == set(nodes)
    assert (run.progress.done == "success") == all(s == "success" for s in statuses.values())
    for key in nodes:  # skipped exactly when some upstream path has a dead node
        if statuses[key] == "skipped":
            assert any(statuses[d] in ("dead", "skipped") for d in nodes[key])


def test_retention_keeps_live_runs_and_drops_old_finished_ones_and_orphans() -> None:
    run = Run({"a": []})
    assert not p.expired(run.progress, True, 10**12, 1, 1)  # started, not finished: kept
    run.node("a", Status.SUCCESS)
    ended = run.progress.ended_at_ms
    assert ended is not None
    assert not p.expired(run.progress, False, ended + 1000, 3600_000, 1)
    assert p.expired(run.progress, False, ended + 3600_001, 3600_000, 1)
    orphan = p.new_progress("r2", None, 5)
    assert not p.expired(orphan, False, 5 + 86_400_000, 3600_000, 86_400_000)
    assert p.expired(orphan, False, 6 + 86_400_000, 3600_000, 86_400_000)


def test_the_tables_entries_survive_json_and_keep_the_format_earlier_builds_wrote() -> None:
    """faust keeps the tables as JSON in their changelogs: a restarted resolver restores them
    from there, including entries an earlier build (plain dicts) wrote."""
    run = Run(DIAMOND)
    run.node("a", Status.SUCCESS)
    run.node("b", Status.DEAD)
    run.progress.partition = 3
    assert run.shape is not None
    progress = json.loads(json.dumps(run.progress.to_table()))
    shape = json.loads(json.dumps(run.shape.to_table()))
    assert p.Progress.from_table(progress) == run.progress
    assert p.Shape.from_table(shape) == run.shape
    earlier = {
        "run_id": "r1",
        "dag_id": "dag",
        "statuses": {"a": "success", "b": "dead", "c": "success", "d": "skipped"},
        "done": "failed",
        "trigger_job_id": "trigger",
        "seen_at_ms": 0,
        "ended_at_ms": 1,
        "partition": 3,
    }
    restored = p.Progress.from_table(earlier)
    assert restored.done is DagRunStatus.FAILED and restored.statuses["d"] is Status.SKIPPED
    assert restored.to_table() == earlier
    assert all(type(s) is str for s in restored.to_table()["statuses"].values())
    assert set(shape) == {"dag_id", "trigger_job_id", "started_at_ms", "nodes", "job_ids"}
