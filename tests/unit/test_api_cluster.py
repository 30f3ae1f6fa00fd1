"""The pure half of ``GET /v1/cluster``: the answer built from what Kafka said (ownership,
unowned partitions, worker groups and their queues; topic names are parsed by
``Topics.parse_execution``, tested with the queues)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from duetime.core.models import PRIORITY_ORDER
from duetime.core.topics import QUEUE_PATTERN, Topics
from duetime.producers.api.cluster import MAX_GROUPS, Group, Member, Snapshot, build, to_describe

PRIORITIES = [p.value for p in PRIORITY_ORDER]
AT = datetime(2026, 12, 2, tzinfo=UTC)
prefixes = st.sampled_from(["duetime.", "t0123456789.", "", "a.b."])
queues = st.one_of(st.just("default"), st.from_regex(r"\A" + QUEUE_PATTERN + r"\Z"))


def member(client: str, *assignment: tuple[str, int]) -> Member:
    return Member(f"m-{client}", f"duetime-{client}", "/127.0.0.1", None, tuple(assignment))


@given(
    st.integers(min_value=1, max_value=24),
    st.lists(st.sets(st.integers(min_value=0, max_value=30)), max_size=4),
)
def test_unowned_partitions_are_what_no_scheduler_owns(
    partitions: int, owned: list[set[int]]
) -> None:
    p = "duetime."
    members = tuple(
        member(f"s{i}", *[(f"{p}jobs", x) for x in mine], *[(f"{p}results", x) for x in mine])
        for i, mine in enumerate(owned)
    )
    got = build(
        Snapshot(
            {f"{p}schedulers": Group(f"{p}schedulers", "stable", "classic", members)}, partitions
        ),
        p,
        AT,
    )
    everyone = set().union(*owned) if owned else set()
    assert got["unowned_partitions"] == sorted(set(range(partitions)) - everyone)
    assert [m["partitions"] for m in got["schedulers"]["members"]] == [sorted(o) for o in owned]


def test_worker_groups_are_found_by_their_execution_topics_with_their_queues() -> None:
    p = "duetime."
    groups = {
        f"{p}workers": Group(
            f"{p}workers",
            "stable",
            "consumer",
            (
                member(
                    "w1", (f"{p}exec.low", 0), (f"{p}exec.critical", 1), (f"{p}exec.critical", 0)
                ),
            ),
        ),
        "gpu-pool": Group(
            "gpu-pool",
            "stable",
            "consumer",
            (
                member(
                    "w2",
                    (f"{p}exec.gpu.normal", 2),
                    (f"{p}exec.gpu.critical", 2),
                    (f"{p}exec.high", 0),
                ),
            ),
        ),
        "someone-else": Group(
            "someone-else",
            "stable",
            "classic",
            (member("x", ("orders", 0), ("other.exec.normal", 0)),),
        ),
        f"{p}schedulers": Group(
            f"{p}schedulers", "stable", "classic", (member("s", (f"{p}jobs", 0)),)
        ),
        f"{p}projector": Group(
            f"{p}projector", "stable", "classic", (member("pr", (f"{p}jobs", 0)),)
        ),
    }
    snap = Snapshot(groups, 3, leases={"w2": (2, AT)})
    got = build(snap, p, AT)
    by = {g["group"]: g for g in got["workers"]}
    assert sorted(by) == ["duetime.workers", "gpu-pool"]
    (w1,) = by["duetime.workers"]["members"]
    assert [(q["queue"], q["priority"], q["partitions"]) for q in w1["queues"]] == [
        ("default", "critical", [0, 1]),
        ("default", "low", [0]),
    ]
    assert (w1["leases_held"], w1["last_lease_renewal_at"], w1["worker_id"]) == (0, None, "w1")
    gpu = by["gpu-pool"]
    assert gpu["queues"] == ["default", "gpu"]
    (w2,) = gpu["members"]
    assert [(q["queue"], q["priority"]) for q in w2["queues"]] == [
        ("default", "high"),
        ("gpu", "critical"),
        ("gpu", "normal"),
    ]
    assert (w2["leases_held"], w2["last_lease_renewal_at"]) == (2, AT)
    assert got["projector"]["members"][0]["topics"] == [f"{p}jobs"]
    assert got["resolver"] is None and got["unowned_partitions"] == [1, 2]


def test_an_empty_default_worker_group_is_still_shown() -> None:
    p = "duetime."
    got = build(Snapshot({f"{p}workers": Group(f"{p}workers", "empty", "consumer")}, 3), p, AT)
    assert [(g["group"], g["state"], g["members"]) for g in got["workers"]] == [
        (f"{p}workers", "empty", [])
    ]
    assert got["schedulers"] is None and got["unowned_partitions"] == [0, 1, 2]


@given(
    prefixes,
    st.lists(
        st.tuples(queues, st.sampled_from(PRIORITIES), st.integers(min_value=0, max_value=63)),
        max_size=12,
    ),
)
def test_a_workers_queues_are_what_it_is_assigned(
    prefix: str, assigned: list[tuple[str, str, int]]
) -> None:
    topics = Topics(prefix)
    w = member("w", *[(topics.execution(p, q), n) for q, p, n in assigned], (f"{prefix}jobs", 0))
    group = Group(f"{prefix}workers", "stable", "consumer", (w,))
    (out,) = build(Snapshot({group.group_id: group}, 1), prefix, AT)["workers"]
    rows = out["members"][0]["queues"]
    shown = {(r["queue"], r["priority"], n) for r in rows for n in r["partitions"]}
    assert shown == set(assigned)
    names = [r["queue"] for r in rows]
    assert out["queues"] == sorted(set(names), key=lambda q: (q != "default", q))
    assert names == sorted(names, key=lambda q: (q != "default", q))  # default first, by name


def test_empty_groups_of_others_are_not_described_and_ours_come_first() -> None:
    p = "duetime."
    listed = [
        ("zzz-busy", False, "stable"),
        ("old-empty", False, "empty"),
        ("gone", False, "dead"),
        ("simple", True, "empty"),
        (f"{p}workers", False, "empty"),  # no worker alive: worth showing
        (f"{p}schedulers", False, "stable"),
        (f"{p}gpu", False, "stable"),
    ]
    ids, truncated = to_describe(listed, p)
    assert ids == [f"{p}schedulers", f"{p}workers", f"{p}gpu", "zzz-busy"] and not truncated


@given(st.integers(min_value=0, max_value=3 * MAX_GROUPS))
def test_at_most_max_groups_are_described_and_truncation_is_said(n: int) -> None:
    listed = [(f"g{i:04d}", False, "stable") for i in range(n)] + [
        ("duetime.schedulers", False, "empty")
    ]
    ids, truncated = to_describe(listed, "duetime.")
    assert ids[0] == "duetime.schedulers" and len(ids) == min(n + 1, MAX_GROUPS)
    assert truncated == (n + 1 > MAX_GROUPS)
