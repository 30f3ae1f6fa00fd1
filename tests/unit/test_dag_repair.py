"""Repair of a DAG run (duetime.core.dag.repair_plan): examples and hypothesis properties.

The properties play whole runs the way the resolver does (release on success, skip every
descendant of a dead or cancelled node), then repair them and play the repair out."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from duetime.core.dag import (
    REPAIRABLE,
    children,
    descendants,
    repair_plan,
    roots,
    run_outcome,
    to_skip,
)
from tests.unit.test_dag import DIAMOND, dags

CHAIN = {"a": [], "b": ["a"], "c": ["b"]}

Outcome = st.sampled_from(["success", "dead", "cancelled", "expired"])


def play(
    nodes: dict[str, list[str]],
    statuses: dict[str, str],
    ready: list[str],
    outcome_of: dict[str, str],
) -> dict[str, str]:
    """Run ``ready`` nodes to the end as the resolver would: each ends with its drawn outcome
    (success unless drawn otherwise), successes release children whose upstreams all
    succeeded, anything else skips every descendant."""
    kids = children(nodes)
    queue = list(ready)
    while queue:
        key = queue.pop(0)
        if statuses.get(key) in ("success", "dead", "cancelled", "expired", "skipped"):
            continue
        result = outcome_of.get(key, "success")
        statuses[key] = result
        if result == "success":
            for child in kids[key]:
                if statuses.get(child) == "blocked" and all(
                    statuses.get(dep) == "success" for dep in nodes[child]
                ):
                    statuses[child] = "pending"
                    queue.append(child)
        else:
            for node in to_skip(nodes, key, child_map=kids):
                if statuses.get(node) not in ("success",):
                    statuses[node] = "skipped"
    return statuses


def first_run(nodes: dict[str, list[str]], outcome_of: dict[str, str]) -> dict[str, str]:
    statuses = {k: "blocked" if nodes[k] else "pending" for k in nodes}
    return play(nodes, statuses, roots(nodes), outcome_of)


def test_chain_whose_head_died() -> None:
    statuses = {"a": "dead", "b": "skipped", "c": "skipped"}
    plan = repair_plan(CHAIN, statuses)
    assert plan.rerun == ["a"]
    assert plan.reblock == ["b", "c"]
    assert plan


def test_middle_node_died_keeps_the_head() -> None:
    plan = repair_plan(CHAIN, {"a": "success", "b": "dead", "c": "skipped"})
    assert (plan.rerun, plan.reblock) == (["b"], ["c"])


def test_nothing_to_repair() -> None:
    assert not repair_plan(CHAIN, dict.fromkeys(CHAIN, "success"))
    # a run already being repaired: its dead node is pending again, its descendants blocked
    being_repaired = {"a": "pending", "b": "blocked", "c": "blocked"}
    plan = repair_plan(CHAIN, being_repaired)
    assert (plan.rerun, plan.reblock) == ([], [])


def test_a_node_below_another_dead_branch_stays_skipped() -> None:
    statuses = {"A": "success", "B": "dead", "C": "dead", "D": "skipped"}
    plan = repair_plan(DIAMOND, statuses, only={"B"})
    assert plan.rerun == ["B"]
    assert plan.reblock == []  # C stays dead and still dooms D
    both = repair_plan(DIAMOND, statuses)
    assert (both.rerun, both.reblock) == (["B", "C"], ["D"])


def test_cancelled_is_never_rerun_and_keeps_its_descendants_skipped() -> None:
    statuses = {"A": "success", "B": "cancelled", "C": "dead", "D": "skipped"}
    plan = repair_plan(DIAMOND, statuses)
    assert (plan.rerun, plan.reblock) == (["C"], [])


def test_expired_is_repairable() -> None:
    assert "expired" in REPAIRABLE
    plan = repair_plan(CHAIN, {"a": "success", "b": "expired", "c": "skipped"})
    assert (plan.rerun, plan.reblock) == (["b"], ["c"])


def test_only_names_a_node_that_is_not_dead() -> None:
    statuses = {"a": "success", "b": "dead", "c": "skipped"}
    assert not repair_plan(CHAIN, statuses, only={"a"})
    assert not repair_plan(CHAIN, statuses, only={"zz"})


@given(dags(), st.data())
def test_plan_is_consistent(nodes: dict[str, list[str]], data: st.DataObject) -> None:
    outcome_of = {k: data.draw(Outcome, label=k) for k in sorted(nodes)}
    statuses = first_run(nodes, outcome_of)
    before = dict(statuses)
    plan = repair_plan(nodes, statuses)
    assert statuses == before  # pure: the input is not touched
    assert plan.rerun == sorted(plan.rerun) and plan.reblock == sorted(plan.reblock)
    assert not set(plan.rerun) & set(plan.reblock)
    for key in plan.rerun:
        assert statuses[key] in REPAIRABLE
        assert all(statuses[dep] == "success" for dep in nodes[key])
    rerun_reach = set().union(*(descendants(nodes, k) for k in plan.rerun))
    for key in plan.reblock:
        assert statuses[key] == "skipped"
        assert key in rerun_reach
    # every repairable node of a played run ran, so all of them are re-run
    assert set(plan.rerun) == {k for k, s in statuses.items() if s in REPAIRABLE}
    assert bool(plan) == bool(plan.rerun)


@given(dags(), st.data())
def test_repaired_run_succeeds_when_nothing_fails_again(
    nodes: dict[str, list[str]], data: st.DataObject
) -> None:
    outcome_of = {k: data.draw(Outcome, label=k) for k in sorted(nodes)}
    statuses = first_run(nodes, outcome_of)
    assert run_outcome(nodes, statuses) is not None  # the first run ended
    plan = repair_plan(nodes, statuses)
    for key in plan.rerun:
        statuses[key] = "pending"
    for key in plan.reblock:
        statuses[key] = "blocked"
    ran_again = set(plan.rerun)
    # the repair: every node that runs now succeeds
    repaired = play(nodes, statuses, plan.rerun, {})
    if "cancelled" in outcome_of.values() and "cancelled" in repaired.values():
        assert run_outcome(nodes, repaired) == "cancelled"
    else:
        assert run_outcome(nodes, repaired) == "success"
        # exactly the nodes that had not succeeded ran again, each once (play runs a node
        # at most once: an ended node is passed over)
        not_succeeded = {k for k, s in first_run(nodes, outcome_of).items() if s != "success"}
        assert ran_again | set(plan.reblock) == not_succeeded
    # a second repair of the repaired run finds nothing to do
    assert not repair_plan(nodes, repaired)


@given(dags(), st.data())
def test_partial_repair_never_reblocks_a_doomed_node(
    nodes: dict[str, list[str]], data: st.DataObject
) -> None:
    outcome_of = {k: data.draw(Outcome, label=k) for k in sorted(nodes)}
    statuses = first_run(nodes, outcome_of)
    dead = sorted(k for k, s in statuses.items() if s in REPAIRABLE)
    only = set(data.draw(st.lists(st.sampled_from(dead), unique=True))) if dead else set()
    plan = repair_plan(nodes, statuses, only)
    assert set(plan.rerun) <= only
    doomed = [k for k, s in statuses.items() if k not in plan.rerun and s in REPAIRABLE]
    doomed += [k for k, s in statuses.items() if s == "cancelled"]
    kept_skipped = set().union(*(descendants(nodes, k) for k in doomed))
    assert not set(plan.reblock) & kept_skipped
