"""DAG validation and resolution (duetime.core.dag): examples and hypothesis properties."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core.dag import (
    children,
    descendants,
    ready_to_release,
    roots,
    run_outcome,
    to_skip,
    validate_dag,
    validate_dag_pairs,
)
from duetime.core.errors import DagCycleError, ValidationError

DIAMOND = {"A": [], "B": ["A"], "C": ["A"], "D": ["B", "C"]}


@st.composite
def dags(draw: st.DrawFn, max_size: int = 30) -> dict[str, list[str]]:
    """Random DAGs: node i may depend only on nodes with a lower index."""
    n = draw(st.integers(min_value=1, max_value=max_size))
    # Names are shuffled relative to the index so the order is not just sorted names.
    names = draw(st.permutations([f"n{i}" for i in range(n)]))
    nodes: dict[str, list[str]] = {}
    for i in range(n):
        ups = draw(st.sets(st.integers(min_value=0, max_value=i - 1), max_size=4)) if i else set()
        nodes[names[i]] = [names[j] for j in sorted(ups)]
    return nodes


def assert_topological(nodes: dict[str, list[str]], order: list[str]) -> None:
    assert sorted(order) == sorted(nodes)
    position = {key: i for i, key in enumerate(order)}
    for key, deps in nodes.items():
        for dep in deps:
            assert position[dep] < position[key], (dep, key)


# --- validation -------------------------------------------------------------------------


@given(dags())
def test_random_dags_validate_and_order_respects_every_edge(nodes: dict[str, list[str]]) -> None:
    order = validate_dag(nodes)
    assert_topological(nodes, order)
    assert validate_dag(dict(reversed(nodes.items()))) == order  # deterministic


@given(dags(), st.data())
def test_back_edge_reports_a_real_cycle(nodes: dict[str, list[str]], data: st.DataObject) -> None:
    with_descendants = [k for k in sorted(nodes) if descendants(nodes, k)]
    if not with_descendants:
        return
    # Making an ancestor depend on one of its descendants closes a cycle.
    ancestor = data.draw(st.sampled_from(with_descendants))
    target = data.draw(st.sampled_from(sorted(descendants(nodes, ancestor))))
    bad = {k: list(v) for k, v in nodes.items()}
    bad[ancestor].append(target)
    with pytest.raises(DagCycleError) as info:
        validate_dag(bad)
    cycle = info.value.details["cycle"]
    assert cycle[0] == cycle[-1]
    assert len(cycle) >= 3
    assert len(set(cycle[:-1])) == len(cycle) - 1  # a simple cycle
    for a, b in itertools.pairwise(cycle):
        assert a in bad[b], f"{a} → {b} is not an edge"
    assert " → ".join(cycle) in info.value.message


def test_cycle_message_and_path() -> None:
    with pytest.raises(DagCycleError) as info:
        validate_dag({"a": ["c"], "b": ["a"], "c": ["b"], "d": ["a"]})
    assert info.value.details["cycle"] == ["a", "b", "c", "a"]
    assert "a → b → c → a" in info.value.message
    assert info.value.code == "dag_cycle"


def test_self_loop_names_the_node() -> None:
    with pytest.raises(DagCycleError, match="'x' depends on itself"):
        validate_dag({"x": ["x"]})


def test_unknown_upstreams_are_named() -> None:
    with pytest.raises(ValidationError, match="'ghost'") as info:
        validate_dag({"a": [], "b": ["a", "ghost"], "c": ["phantom"]})
    assert info.value.details["unknown"] == ["ghost", "phantom"]
    assert info.value.details["referenced_by"] == {"ghost": ["b"], "phantom": ["c"]}


def test_duplicate_keys_via_pairs() -> None:
    with pytest.raises(ValidationError, match="duplicate job keys in the DAG: 'a'") as info:
        validate_dag_pairs([("a", []), ("b", ["a"]), ("a", ["b"])])
    assert info.value.details["duplicates"] == ["a"]
    assert validate_dag_pairs([("b", ["a"]), ("a", [])]) == ["a", "b"]


def test_empty_and_too_many() -> None:
    with pytest.raises(ValidationError, match="at least one job"):
        validate_dag({})
    with pytest.raises(ValidationError, match="at least one job"):
        validate_dag_pairs([])
    with pytest.raises(ValidationError, match="at most 3 jobs"):
        validate_dag({k: [] for k in "abcd"}, max_nodes=3)
    with pytest.raises(ValidationError, match="at most 3 jobs"):
        validate_dag_pairs([(k, []) for k in "abcd"], max_nodes=3)


@pytest.mark.parametrize("key", ["", "a b", "é", "x" * 201, "a/b", "a\n", 7, None])
def test_bad_keys_are_refused(key: object) -> None:
    with pytest.raises(ValidationError, match="invalid job key"):
        validate_dag({key: []})  # type: ignore[dict-item]  # deliberately wrong input


def test_good_key_limits() -> None:
    key = "A-z_0.9" + "x" * 193
    assert validate_dag({key: []}) == [key]


@pytest.mark.parametrize("deps", ["a", [1], ["a", "a"]])
def test_bad_depends_on_is_refused(deps: object) -> None:
    with pytest.raises(ValidationError, match=r"depends_on of job 'b'|more than once"):
        validate_dag({"a": [], "b": deps})  # type: ignore[dict-item]  # deliberately wrong


def test_order_is_smallest_ready_first() -> None:
    assert validate_dag(DIAMOND) == ["A", "B", "C", "D"]
    assert validate_dag({"z": [], "y": ["z"], "a": []}) == ["a", "z", "y"]


def test_long_chain_validates_fast_without_recursion() -> None:
    n = 10_000
    nodes = {f"j{i:05d}": [f"j{i - 1:05d}"] if i else [] for i in range(n)}
    started = time.perf_counter()
    order = validate_dag(nodes)
    assert order == sorted(nodes)
    assert len(descendants(nodes, "j00000")) == n - 1
    assert time.perf_counter() - started < 2.0
    nodes["j00000"] = ["j09999"]  # close the chain into one 10,000-node cycle
    with pytest.raises(DagCycleError) as info:
        validate_dag(nodes)
    assert len(info.value.details["cycle"]) == n + 1


def test_layered_dag_of_1000_nodes() -> None:
    layers, width = 10, 100
    nodes: dict[str, list[str]] = {}
    for layer in range(layers):
        for i in range(width):
            ups = [f"l{layer - 1}_{j}" for j in range(width)] if layer else []
            nodes[f"l{layer}_{i}"] = ups
    order = validate_dag(nodes)
    assert_topological(nodes, order)
    assert roots(nodes) == sorted(f"l0_{i}" for i in range(width))
    assert len(descendants(nodes, "l0_0")) == (layers - 1) * width


# --- resolution -------------------------------------------------------------------------


def test_roots_and_children() -> None:
    assert roots(DIAMOND) == ["A"]
    assert children(DIAMOND) == {"A": ["B", "C"], "B": ["D"], "C": ["D"], "D": []}


def test_diamond_release() -> None:
    released = {"A"}
    succeeded = {"A"}
    assert ready_to_release(DIAMOND, succeeded, "A", released) == ["B", "C"]
    released |= {"B", "C"}
    succeeded.add("B")
    assert ready_to_release(DIAMOND, succeeded, "B", released) == []  # C still running
    # C's success releases D even before the caller adds C to `succeeded`.
    assert ready_to_release(DIAMOND, succeeded, "C", released) == ["D"]
    released.add("D")
    succeeded.add("C")
    assert ready_to_release(DIAMOND, succeeded, "C", released) == []  # redelivered result
    assert ready_to_release(DIAMOND, succeeded, "D", released) == []


def test_dead_upstream_skips_descendants() -> None:
    assert to_skip(DIAMOND, "B") == {"D"}
    assert to_skip(DIAMOND, "A") == {"B", "C", "D"}
    assert to_skip(DIAMOND, "D") == set()
    with pytest.raises(KeyError):
        to_skip(DIAMOND, "nope")


@given(dags(), st.data())
def test_simulated_run_releases_each_node_once_after_its_upstreams(
    nodes: dict[str, list[str]], data: st.DataObject
) -> None:
    kids = children(nodes)
    released = set(roots(nodes))
    succeeded: set[str] = set()
    running = sorted(released)
    while running:
        key = running.pop(data.draw(st.integers(0, len(running) - 1)))
        new = ready_to_release(nodes, succeeded, key, released, child_map=kids)
        assert new == ready_to_release(nodes, succeeded, key, released)
        succeeded.add(key)
        for child in new:
            assert all(dep in succeeded for dep in nodes[child])
        assert not released & set(new)
        released |= set(new)
        running.extend(new)
    assert released == succeeded == set(nodes)
    assert run_outcome(nodes, dict.fromkeys(nodes, "success")) == "success"


@given(dags(), st.data())
def test_descendants_match_reachability(nodes: dict[str, list[str]], data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(sorted(nodes)))
    found = descendants(nodes, key)
    assert key not in found
    for node in nodes:  # node is a descendant iff one of its upstreams is key or one
        reached = any(dep == key or dep in found for dep in nodes[node])
        assert (node in found) == reached


def test_run_outcome() -> None:
    assert run_outcome(DIAMOND, {}) is None
    assert run_outcome(DIAMOND, {"A": "success", "B": "running"}) is None
    assert run_outcome(DIAMOND, dict.fromkeys(DIAMOND, "success")) == "success"
    assert run_outcome(DIAMOND, {"A": "success", "B": "dead", "C": "success"}) is None
    dead = {"A": "success", "B": "dead", "C": "success", "D": "skipped"}
    assert run_outcome(DIAMOND, dead) == "failed"
    assert run_outcome(DIAMOND, {**dead, "B": "failed"}) is None  # a retry is coming
    # a cancelled member makes the run cancelled (it cannot be repaired), not merely failed
    assert run_outcome(DIAMOND, {**dead, "B": "cancelled"}) == "cancelled"


@settings(max_examples=50)
@given(dags(max_size=12), st.data())
def test_pairs_and_mapping_agree(nodes: dict[str, list[str]], data: st.DataObject) -> None:
    pairs = data.draw(st.permutations(list(nodes.items())))
    assert validate_dag_pairs(pairs) == validate_dag(nodes)
