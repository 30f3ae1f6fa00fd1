"""``GET /v1/cluster``: who is alive in the cluster, as Kafka's group coordinators see it.

Every role is a consumer-group member (DESIGN.md), so the groups say it all: the schedulers'
group says which scheduler owns which partitions (partition p of the jobs topic, and with it
p of every co-partitioned input); worker groups are the groups whose members are assigned
execution topics (``<prefix>exec.<priority>`` for the default queue,
``<prefix>exec.<queue>.<priority>`` for the others), each member with the queues it reads;
the resolver's and the projector's groups follow. Every member listed was seen at the
answer's ``at`` (the time of this describe); a worker that holds leases also shows its latest
lease renewal from PostgreSQL, its own heartbeat while it runs work.

Guarantees: nothing is cached; each of the three rounds of Kafka requests (metadata, list the
groups, describe them) is waited on for at most ``KAFKA_CALL_S``, and a caller waits at most
``ANSWER_S`` (then 503 ``unavailable``, naming what did not answer); one describe runs at a
time per API process: concurrent callers share it, so an unanswering broker never has
threads piled onto it. The admin requests are sent
without librdkafka's ``request_timeout`` (a describe that timed out mid coordinator lookup
aborted a test process on the three-broker cluster: librdkafka 2.16, ``eonce->refcnt > 0``);
the wait on their futures is what is bounded here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from confluent_kafka import KafkaException
from fastapi import APIRouter
from pydantic import BaseModel, Field

from duetime.core.models import PRIORITY_ORDER, Priority
from duetime.core.redact import redact_text
from duetime.core.topics import DEFAULT_QUEUE, Topics

from .deps import Res
from .errors import Unavailable
from .schemas import errors

router = APIRouter()

KAFKA_CALL_S = 5.0
"""How long one round of Kafka admin requests is waited on."""
ANSWER_S = 3 * KAFKA_CALL_S + 1.0
"""How long a caller waits for the describe (its three rounds) before answering 503."""
MAX_GROUPS = 200
"""Groups described at most (a shared Kafka may hold thousands of other services' groups)."""


# --- what Kafka said, as plain data (pure functions below build the answer from it) -------


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    client_id: str
    host: str
    instance_id: str | None
    assignment: tuple[tuple[str, int], ...]
    """(topic, partition) pairs assigned to the member."""

    def assignment_queues(self, prefix: str) -> list[tuple[str, Priority, int]]:
        """The execution-topic part of the assignment: (queue, priority, partition)."""
        topics = Topics(prefix)
        out = []
        for topic, partition in self.assignment:
            parsed = topics.parse_execution(topic)
            if parsed is not None:
                out.append((parsed[0], parsed[1], partition))
        return out


@dataclass(frozen=True, slots=True)
class Group:
    group_id: str
    state: str
    protocol: str
    members: tuple[Member, ...] = ()


@dataclass(frozen=True, slots=True)
class Snapshot:
    groups: Mapping[str, Group]
    """Every described group by id."""
    partitions: int
    """Partitions of the jobs topic (0 when it does not exist)."""
    truncated: bool = False
    warnings: tuple[str, ...] = ()
    leases: Mapping[str, tuple[int, datetime | None]] = field(default_factory=dict)
    """Worker id → (leases held, latest renewal) from PostgreSQL."""


@dataclass(frozen=True, slots=True)
class RoleGroups:
    """The consumer group each role runs under (workers: the default group only; a worker
    pool may name its own with DUETIME_WORKER_GROUP)."""

    schedulers: str
    resolver: str
    projector: str
    workers: str

    @classmethod
    def of(cls, prefix: str) -> RoleGroups:
        return cls(
            f"{prefix}schedulers", f"{prefix}resolver", f"{prefix}projector", f"{prefix}workers"
        )

    @property
    def not_workers(self) -> frozenset[str]:
        # the schedulers' restore consumer has a group id but assigns partitions itself
        return frozenset(
            {self.schedulers, f"{self.schedulers}-restore", self.resolver, self.projector}
        )


def _partitions(assignment: Iterable[tuple[str, int]], topic: str) -> list[int]:
    return sorted({p for t, p in assignment if t == topic})


def _queues(m: Member, prefix: str) -> list[dict[str, Any]]:
    """Per (queue, priority) the member reads: its partitions; default queue first, then by
    name, priorities in the order workers drain them."""
    by: dict[tuple[str, Priority], set[int]] = {}
    for queue, priority, partition in m.assignment_queues(prefix):
        by.setdefault((queue, priority), set()).add(partition)
    order = {p: i for i, p in enumerate(PRIORITY_ORDER)}
    keys = sorted(by, key=lambda k: (k[0] != DEFAULT_QUEUE, k[0], order[k[1]]))
    return [{"queue": q, "priority": p.value, "partitions": sorted(by[(q, p)])} for q, p in keys]


def _worker_id(client_id: str) -> str:
    # every role's client.id is duetime-<instance id>; the worker's leases name the instance
    return client_id.removeprefix("duetime-")


def _member_out(m: Member, seen_at: datetime) -> dict[str, Any]:
    return {
        "member_id": m.member_id,
        "client_id": m.client_id,
        "host": m.host,
        "instance_id": m.instance_id,
        "seen_at": seen_at,
    }


def _group_out(g: Group, role: str) -> dict[str, Any]:
    return {"group": g.group_id, "role": role, "state": g.state, "protocol": g.protocol}


def is_worker_group(g: Group, prefix: str) -> bool:
    return any(m.assignment_queues(prefix) for m in g.members)


def build(snap: Snapshot, prefix: str, at: datetime) -> dict[str, Any]:
    """The answer of ``GET /v1/cluster`` from what Kafka (and the leases) said."""
    topics = Topics(prefix)
    roles = RoleGroups.of(prefix)
    schedulers = snap.groups.get(roles.schedulers)
    owned: set[int] = set()
    scheduler_members = []
    for m in schedulers.members if schedulers else ():
        mine = _partitions(m.assignment, topics.jobs)
        owned.update(mine)
        scheduler_members.append({**_member_out(m, at), "partitions": mine})
    workers = [
        g
        for gid, g in sorted(snap.groups.items())
        if gid not in roles.not_workers and (gid == roles.workers or is_worker_group(g, prefix))
    ]
    return {
        "at": at,
        "prefix": prefix,
        "partitions": snap.partitions,
        "schedulers": None
        if schedulers is None
        else {**_group_out(schedulers, "scheduler"), "members": scheduler_members},
        "unowned_partitions": sorted(set(range(snap.partitions)) - owned),
        "workers": [_worker_group_out(g, snap, prefix, at) for g in workers],
        "resolver": _plain(snap.groups.get(roles.resolver), "resolver", at),
        "projector": _plain(snap.groups.get(roles.projector), "projector", at),
        "truncated": snap.truncated,
        "warnings": list(snap.warnings),
    }


def _worker_group_out(g: Group, snap: Snapshot, prefix: str, at: datetime) -> dict[str, Any]:
    members = []
    names: set[str] = set()
    for m in g.members:
        held, renewed = snap.leases.get(_worker_id(m.client_id), (0, None))
        names.update(queue for queue, _, _ in m.assignment_queues(prefix))
        members.append(
            {
                **_member_out(m, at),
                "worker_id": _worker_id(m.client_id),
                "queues": _queues(m, prefix),
                "leases_held": held,
                "last_lease_renewal_at": renewed,
            }
        )
    ordered = sorted(names, key=lambda q: (q != DEFAULT_QUEUE, q))
    return {**_group_out(g, "worker"), "queues": ordered, "members": members}


def _plain(g: Group | None, role: str, at: datetime) -> dict[str, Any] | None:
    if g is None:
        return None
    members = [
        {**_member_out(m, at), "topics": sorted({t for t, _ in m.assignment})} for m in g.members
    ]
    return {**_group_out(g, role), "members": members}


def to_describe(listed: Iterable[tuple[str, bool, str]], prefix: str) -> tuple[list[str], bool]:
    """Which listed groups (id, simple, state) to describe, at most MAX_GROUPS, and whether
    some were left out. This prefix's role groups always (an empty one is news: no scheduler,
    no worker); other groups only with members (an empty group has nobody alive to show, and a
    shared Kafka keeps many), duetime's own first."""
    roles = RoleGroups.of(prefix)
    ours = {roles.schedulers, roles.workers, roles.resolver, roles.projector}
    ids = sorted(
        {
            gid
            for gid, simple, state in listed
            if not simple and (gid in ours or state not in ("empty", "dead"))
        },
        key=lambda gid: (gid not in ours, not gid.startswith(prefix), gid),
    )
    return ids[:MAX_GROUPS], len(ids) > MAX_GROUPS


# --- Kafka --------------------------------------------------------------------------------


def _name(value: Any) -> str:
    """An enum of confluent-kafka (ConsumerGroupState.STABLE) as "stable"."""
    text = getattr(value, "name", None) or str(value)
    return str(text).rsplit(".", 1)[-1].lower()


def _member(m: Any) -> Member:
    tps = getattr(getattr(m, "assignment", None), "topic_partitions", None) or []
    return Member(
        member_id=str(m.member_id),
        client_id=str(m.client_id or ""),
        host=str(m.host or "").lstrip("/"),
        instance_id=None if not m.group_instance_id else str(m.group_instance_id),
        assignment=tuple((str(tp.topic), int(tp.partition)) for tp in tps),
    )


def _describe(admin: Any, prefix: str) -> Snapshot:
    """List the groups, describe the ones that matter, read the jobs topic's partitions: three
    rounds of Kafka requests, each waited on for at most KAFKA_CALL_S."""
    topics = Topics(prefix)
    # first a metadata request: it raises when no broker answers, where listing groups
    # answers "no groups" (seen with librdkafka 2.16), which would read as "nobody alive"
    md = admin.list_topics(topic=topics.jobs, timeout=KAFKA_CALL_S)
    meta = md.topics.get(topics.jobs)
    partitions = len(meta.partitions) if meta is not None and meta.error is None else 0
    listed = admin.list_consumer_groups().result(timeout=KAFKA_CALL_S)
    warnings = [redact_text(f"listing groups: {e}")[:200] for e in (listed.errors or [])]
    ids, truncated = to_describe(
        (
            (g.group_id, bool(g.is_simple_consumer_group), _name(g.state))
            for g in listed.valid or []
        ),
        prefix,
    )
    groups: dict[str, Group] = {}
    if ids:
        futures = admin.describe_consumer_groups(ids)
        # one wait for them all: a slow coordinator costs KAFKA_CALL_S once, not per group
        concurrent.futures.wait(list(futures.values()), timeout=KAFKA_CALL_S)
        for gid, future in futures.items():
            if not future.done():
                warnings.append(f"describing {gid}: no answer within {KAFKA_CALL_S:g} s")
                continue
            try:
                d = future.result()
            except KafkaException as exc:
                warnings.append(redact_text(f"describing {gid}: {exc}")[:200])
                continue
            groups[gid] = Group(
                group_id=gid,
                state=_name(d.state),
                protocol=_name(getattr(d, "type", "classic")),
                members=tuple(_member(m) for m in d.members),
            )
    return Snapshot(groups, partitions, truncated, tuple(warnings))


async def _leases(res: Any, worker_ids: Sequence[str]) -> dict[str, tuple[int, datetime | None]]:
    """Leases held and the latest renewal per worker (held leases only: bounded by the work
    running now, read through the partial index on held leases)."""
    if not worker_ids:
        return {}
    async with res.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT owner, count(*), max(updated_at) FROM leases "
            "WHERE state = 'held' AND owner = ANY(%s) GROUP BY owner",
            (list(worker_ids),),
        )
        rows = await cur.fetchall()
    return {str(owner): (int(n), at) for owner, n, at in rows}


# --- the route ---------------------------------------------------------------------------


class ClusterMemberOut(BaseModel):
    member_id: str
    client_id: str = Field(description="the member's client.id: duetime-<instance id>")
    host: str
    instance_id: str | None = Field(description="group.instance.id (static membership)")
    seen_at: datetime = Field(description="when the group coordinator last listed it: `at`")


class SchedulerMemberOut(ClusterMemberOut):
    partitions: list[int] = Field(description="partitions it owns (of every job-keyed topic)")


class QueueAssignmentOut(BaseModel):
    queue: str
    priority: Priority
    partitions: list[int]


class WorkerMemberOut(ClusterMemberOut):
    worker_id: str
    queues: list[QueueAssignmentOut]
    leases_held: int = Field(description="executions it runs now (held leases)")
    last_lease_renewal_at: datetime | None = Field(
        description="its latest lease renewal (null when it holds none): its heartbeat"
    )


class RoleMemberOut(ClusterMemberOut):
    topics: list[str]


class GroupBase(BaseModel):
    group: str
    role: str
    state: str = Field(description="stable, preparing_rebalance, empty, dead, ...")
    protocol: str = Field(description="classic or consumer (KIP-848)")


class SchedulerGroupOut(GroupBase):
    members: list[SchedulerMemberOut]


class WorkerGroupOut(GroupBase):
    queues: list[str]
    members: list[WorkerMemberOut]


class RoleGroupOut(GroupBase):
    members: list[RoleMemberOut]


class ClusterOut(BaseModel):
    at: datetime = Field(description="when Kafka was asked: every member listed was seen then")
    prefix: str
    partitions: int = Field(description="partitions of the job-keyed topics")
    schedulers: SchedulerGroupOut | None
    unowned_partitions: list[int] = Field(description="partitions no scheduler owns now")
    workers: list[WorkerGroupOut]
    resolver: RoleGroupOut | None
    projector: RoleGroupOut | None
    truncated: bool = Field(
        description=f"more than {MAX_GROUPS} groups with members: some not described"
    )
    warnings: list[str]


@router.get(
    "/cluster",
    response_model=ClusterOut,
    responses=errors(400, 401, 503),
    summary="schedulers and the partitions they own, worker groups and their queues, "
    "the resolver and the projector: who is alive now",
)
async def cluster(res: Res) -> dict[str, Any]:
    prefix = res.settings.common.topic_prefix
    task = res.cluster_describe
    if task is None or task.done():
        # one describe at a time per process: concurrent callers share it, and a describe
        # still waiting for Kafka is waited on again rather than joined by another thread
        task = asyncio.ensure_future(asyncio.to_thread(_describe, res.admin, prefix))
        task.add_done_callback(_seen)
        res.cluster_describe = task
    try:
        snap: Snapshot = await asyncio.wait_for(asyncio.shield(task), ANSWER_S)
    except (TimeoutError, KafkaException) as exc:
        shown = redact_text(str(exc) or "no answer in time")
        raise Unavailable(f"Kafka did not answer: {shown}"[:300]) from None
    workers = [
        _worker_id(m.client_id)
        for g in snap.groups.values()
        if is_worker_group(g, prefix)
        for m in g.members
    ]
    leases = await _leases(res, workers)
    snap = Snapshot(snap.groups, snap.partitions, snap.truncated, snap.warnings, leases)
    return build(snap, prefix, res.now())


def _seen(task: asyncio.Future[Snapshot]) -> None:
    # a describe whose callers all gave up still ends; its error is theirs, already answered
    if not task.cancelled():
        task.exception()
