"""The resolver's pure transform: releases, skips, completion, redelivery, early events."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.consumers.resolver import progress as p
from duetime.core.dag import children

DIAMOND = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}


def started(nodes: dict[str, list[str]], run_id: str = "r1") -> dict[str, Any]:
    return {
        "dag_id": "dag",
        "dag_run_id": run_id,
        "kind": "started",
        "at_ms": 0,
        "trigger_job_id": "trigger",
        "nodes": [{"key": k, "job_id": f"job-{k}", "depends_on": d} for k, d in nodes.items()],
    }


class Run:
    """A run's progress and shape, driven the way the app drives them."""

    def __init__(self, nodes: dict[str, list[str]], *, start: bool = True) -> None:
        self.progress = p.new_progress("r1", "dag", 0)
        self.nodes = nodes
        self.shape: dict[str, Any] | None = None
        self.sent: list[p.Actions] = []
        if start:
            self.start()

    def start(self) -> p.Actions:
        self.shape = p.shape_of(started(self.nodes))
        return self._keep(p.on_started(self.progress, self.shape, children(self.nodes), 1))

    def node(self, key: str, status: p.NodeEvent) -> p.Actions:
        kids = None if self.shape is None else children(self.nodes)
        return self._keep(p.on_node(self.progress, self.shape, kids, key, status, 1))

    def _keep(self, actions: p.Actions) -> p.Actions:
        self.sent.append(actions)
        return actions


def commands(actions: p.Actions, kind: str) -> list[str]:
    return sorted(c["job_id"].removeprefix("job-") for c in actions.commands if c["kind"] == kind)


def test_a_diamond_releases_d_once_both_upstreams_succeeded() -> None:
    run = Run(DIAMOND)
    assert commands(run.node("a", "success"), "release") == ["b", "c"]
    assert commands(run.node("b", "success"), "release") == []  # c has not succeeded
    assert commands(run.node("c", "success"), "release") == ["d"]
    done = run.node("d", "success")
    [completed] = [e for e in done.events if e["kind"] == "completed"]
    assert completed["status"] == "success"
    assert completed["node_statuses"] == dict.fromkeys("abcd", "success")
    [end] = [c for c in done.commands if c["kind"] == "dag_run_end"]
    assert end["job_id"] == "trigger" and end["reason"] == "success"


def test_a_failed_attempt_changes_nothing_downstream() -> None:
    run = Run(DIAMOND)
    run.node("a", "success")
    failed = run.node("b", "failed")
    assert failed.commands == []
    assert [e["node_status"] for e in failed.events] == ["failed"]
    run.node("c", "success")
    assert commands(run.node("b", "success"), "release") == ["d"]  # the retry succeeded


def test_a_dead_node_skips_every_descendant_and_fails_the_run() -> None:
    run = Run({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": ["d"]})
    run.node("a", "success")
    dead = run.node("b", "dead")
    assert commands(dead, "skip") == ["d", "e"]
    assert run.progress["done"] is None  # c still runs
    done = run.node("c", "success")
    assert commands(done, "release") == []  # d is skipped, not released
    [completed] = [e for e in done.events if e["kind"] == "completed"]
    assert completed["status"] == "failed"
    assert completed["node_statuses"] == {
        "a": "success",
        "b": "dead",
        "c": "success",
        "d": "skipped",
        "e": "skipped",
    }


def test_terminal_statuses_do_not_move() -> None:
    run = Run(DIAMOND)
    run.node("a", "success")
    late = run.node("a", "running")
    assert late.commands == [] and late.events == [] and not late.progress_changed
    assert run.progress["statuses"]["a"] == "success"


def test_a_redelivered_success_resends_its_releases_and_the_scheduler_dedups() -> None:
    run = Run(DIAMOND)
    run.node("a", "success")
    again = run.node("a", "success")  # redelivered after a crash
    assert commands(again, "release") == ["b", "c"]
    assert not again.progress_changed  # nothing new to remember
    ids = {c["command_id"] for c in run.sent[1].commands} | {
        c["command_id"] for c in again.commands
    }
    assert len(ids) == 2  # the same command ids: a resend, not a new command


def test_a_running_child_is_not_released_again() -> None:
    run = Run(DIAMOND)
    run.node("a", "success")
    run.node("b", "running")
    assert commands(run.node("a", "success"), "release") == ["c"]


def test_a_finished_run_answers_a_redelivery_with_its_completion_only() -> None:
    run = Run({"a": []})
    run.node("a", "success")
    again = run.node("a", "success")
    assert [e["kind"] for e in again.events] == ["completed"]
    assert [c["kind"] for c in again.commands] == ["dag_run_end"]


def test_events_before_the_started_event_are_acted_upon_when_it_arrives() -> None:
    run = Run(DIAMOND, start=False)
    early = run.node("a", "success")
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
        outcome: p.NodeEvent = "dead" if key in dead else "success"
        run.node(key, outcome)
        if rng.random() < 0.3:
            run.node(key, outcome)  # a redelivery
        for actions in run.sent:
            for c in actions.commands:
                if c["kind"] == "release":
                    child = c["job_id"].removeprefix("job-")
                    if child not in released:
                        released.append(child)
                        queue.append(child)
        run.sent.clear()
        for child in released:
            assert all(run.progress["statuses"][d] == "success" for d in nodes[child])
    statuses = run.progress["statuses"]
    assert run.progress["done"] in ("success", "failed")
    assert set(statuses) == set(nodes)
    assert (run.progress["done"] == "success") == all(s == "success" for s in statuses.values())
    for key in nodes:  # skipped exactly when some upstream path has a dead node
        if statuses[key] == "skipped":
            assert any(statuses[d] in ("dead", "skipped") for d in nodes[key])


def test_retention_keeps_live_runs_and_drops_old_finished_ones_and_orphans() -> None:
    run = Run({"a": []})
    assert not p.expired(run.progress, True, 10**12, 1, 1)  # started, not finished: kept
    run.node("a", "success")
    ended = run.progress["ended_at_ms"]
    assert not p.expired(run.progress, False, ended + 1000, 3600_000, 1)
    assert p.expired(run.progress, False, ended + 3600_001, 3600_000, 1)
    orphan = p.new_progress("r2", None, 5)
    assert not p.expired(orphan, False, 5 + 86_400_000, 3600_000, 86_400_000)
    assert p.expired(orphan, False, 6 + 86_400_000, 3600_000, 86_400_000)
