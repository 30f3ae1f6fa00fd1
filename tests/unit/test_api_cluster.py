"""The pure half of ``GET /v1/cluster``: execution topic names → (queue, priority), and the
answer built from what Kafka said (ownership, unowned partitions, worker groups, queues)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from duetime.core.models import PRIORITY_ORDER
from duetime.core.topics import Topics
from duetime.producers.api.cluster import Group, Member, QueueTopic, Snapshot, build, queue_topic

PRIORITIES = [p.value for p in PRIORITY_ORDER]
AT = datetime(2026, 12, 2, tzinfo=UTC)
prefixes = st.sampled_from(["duetime.", "t0123456789.", "", "a.b."])
queues = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=20)


@given(prefixes, st.sampled_from(PRIORITIES))
def test_the_default_queue_topics_are_the_priority_topics(prefix: str, priority: str) -> None:
    topic = Topics(prefix).execution(priority)
    assert queue_topic(topic, prefix) == QueueTopic("default", priority)


@given(prefixes, queues, st.sampled_from(PRIORITIES))
def test_a_named_queue_round_trips(prefix: str, queue: str, priority: str) -> None:
    # the priority is the last dot-separated part, so a queue name may hold dots
    assert queue_topic(f"{prefix}exec.{queue}.{priority}", prefix) == QueueTopic(queue, priority)


@given(prefixes, st.text(max_size=30))
def test_other_topics_are_not_queues(prefix: str, name: str) -> None:
    parsed = queue_topic(f"{prefix}{name}", prefix)
    if parsed is not None:  # only names of the form exec.[<queue>.]<priority> parse
        assert name.startswith("exec.") and name.rsplit(".", 1)[-1] == parsed.priority
        assert parsed.priority in PRIORITIES


def test_topics_of_other_prefixes_and_unknown_priorities_are_refused() -> None:
    assert queue_topic("other.exec.normal", "duetime.") is None
    assert queue_topic("duetime.exec.urgent", "duetime.") is None
    assert queue_topic("duetime.exec.", "duetime.") is None
    assert queue_topic("duetime.exec..normal", "duetime.") is None
    assert queue_topic("duetime.jobs", "duetime.") is None


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
