"""Schedulers as real processes: SIGKILL failover, a SIGSTOPped zombie, scale-out under load.

The checker: a read_committed consumer over the execution topics must see every
(job_id, scheduled_at, attempt) exactly once — none missing, none twice.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from duetime.core.config import CommonSettings
from duetime.producers.sdk import JobClient
from tests.e2e.procs import Role, role_env
from tests.helpers import TopicReader, execution_reader, wait_for

TARGET = {"type": "http", "url": "http://127.0.0.1:9/none"}
ONE_TIME_JOBS = 1000
CRON_JOBS = 100
LOAD_S = 15  # the faults happen a third in; the campaign's scheduler churn runs longer


@pytest.fixture
def wide(settings: CommonSettings) -> Iterator[CommonSettings]:
    """More partitions than the default test settings, so ownership really splits."""
    from duetime.core.topics import Topics
    from duetime.infra.topics import create_topics

    wide = replace(settings, topic_prefix=settings.topic_prefix + "w.", partitions=6)
    specs = Topics(wide.topic_prefix).specs(wide.partitions)
    create_topics(wide.bootstrap_servers, specs)
    yield wide
    admin = AdminClient({"bootstrap.servers": wide.bootstrap_servers})
    for future in admin.delete_topics([s.name for s in specs]).values():
        with contextlib.suppress(Exception):
            future.result()


@pytest.fixture
def roles() -> Iterator[list[Role]]:
    started: list[Role] = []
    yield started
    for role in started:
        role.kill()  # continues a paused one first


def group_assignment(settings: CommonSettings) -> dict[str, set[int]]:
    """member client id → partitions of the jobs topic it owns right now."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    group = f"{settings.topic_prefix}schedulers"
    desc = admin.describe_consumer_groups([group])[group].result()
    out: dict[str, set[int]] = {}
    if str(desc.state).split(".")[-1] != "STABLE":
        return out
    for member in desc.members:
        parts = {
            tp.partition
            for tp in member.assignment.topic_partitions
            if tp.topic == f"{settings.topic_prefix}jobs"
        }
        out[member.client_id] = parts
    return out


def owned_by(settings: CommonSettings, n_members: int) -> dict[str, set[int]]:
    def ready() -> dict[str, set[int]] | None:
        try:
            a = group_assignment(settings)
        except Exception:
            return None
        covered = set().union(*a.values()) if a else set()
        ok = len(a) == n_members and all(a.values()) and covered == set(range(settings.partitions))
        return a if ok else None

    result = wait_for(ready, 60, f"{n_members} schedulers to share all partitions")
    assert result is not None
    return result


def owned_in_log(role: Role) -> set[int]:
    """The partitions a scheduler's log says it took (restored and fenced its producer)."""
    return {int(p) for p in re.findall(r"owning partition (\d+)", role.log())}


def load(client: JobClient, start: datetime) -> tuple[list[str], list[str]]:
    """1,000 one-time jobs due over 30 s and 100 crons every 2 s (run_all, overlap allow)."""
    once = [
        client.create_job(
            name=f"once-{i}",
            schedule={"at": (start + timedelta(seconds=LOAD_S * i / ONE_TIME_JOBS)).isoformat()},
            target=TARGET,
            wait=False,
        ).job_id
        for i in range(ONE_TIME_JOBS)
    ]
    crons = [
        client.create_job(
            name=f"cron-{i}",
            schedule={
                "cron": "*/2 * * * * *",
                "start_at": start.isoformat(),
                "end_at": (start + timedelta(seconds=LOAD_S)).isoformat(),
            },
            target=TARGET,
            overlap="allow",
            misfire="run_all",
            wait=False,
        ).job_id
        for i in range(CRON_JOBS)
    ]
    client.flush()
    return once, crons


def check_exactly_once(
    reader: TopicReader, once: list[str], crons: list[str], start: datetime
) -> dict[str, Any]:
    records = reader.snapshot()
    keys = Counter((r["job_id"], r["scheduled_at_ms"], r["attempt"]) for r in records)
    duplicates = {k: n for k, n in keys.items() if n > 1}
    fired = {r["job_id"] for r in records}
    missing_once = [j for j in once if j not in fired]
    start_ms = int(start.timestamp() * 1000)
    grid = {
        t
        for t in range(start_ms - start_ms % 2000, start_ms + LOAD_S * 1000 + 1, 2000)
        if start_ms <= t <= start_ms + LOAD_S * 1000
    }
    missing_cron = 0
    examples: list[int] = []
    for job in crons:
        got = {r["scheduled_at_ms"] for r in records if r["job_id"] == job}
        missing_cron += len(grid - got)
        examples += [t - start_ms for t in sorted(grid - got)][:2]
    lateness = sorted(r["emitted_at_ms"] - r["due_at_ms"] for r in records)
    figures = {
        "records": len(records),
        "duplicates": len(duplicates),
        "missing_one_time": len(missing_once),
        "missing_cron_occurrences": missing_cron,
        "max_lateness_ms": lateness[-1] if lateness else None,
        "p99_lateness_ms": lateness[int(len(lateness) * 0.99)] if lateness else None,
    }
    print("figures:", figures)
    assert not duplicates, f"duplicate execution requests: {list(duplicates.items())[:5]}"
    assert not missing_once, f"{len(missing_once)} one-time jobs never fired"
    assert missing_cron == 0, (
        f"{missing_cron} cron occurrences never fired (ms after start: {examples[:10]})"
    )
    return figures


def expected_cron_fires_done(reader: TopicReader, crons: list[str], end: datetime) -> bool:
    end_ms = int(end.timestamp() * 1000)
    last = {r["job_id"]: r["scheduled_at_ms"] for r in reader.snapshot() if r["job_id"] in crons}
    return len(last) == len(crons) and min(last.values()) >= end_ms - 2000


def _scenario(
    wide: CommonSettings,
    roles: list[Role],
    disturb: Any,
) -> dict[str, Any]:
    env = role_env(wide)
    roles.append(Role.start("sched-a", ["scheduler"], env))
    roles.append(Role.start("sched-b", ["scheduler"], env))
    owned_by(wide, 2)
    reader = execution_reader(wide)
    try:
        start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=5)
        with JobClient(settings=wide) as client:
            once, crons = load(client, start)
        disturb(start)
        end = start + timedelta(seconds=LOAD_S)
        wait_for(
            lambda: (
                datetime.now(UTC) > end + timedelta(seconds=2)
                and expected_cron_fires_done(reader, crons, end)
                and {r["job_id"] for r in reader.snapshot()} >= set(once)
            ),
            LOAD_S + 60,
            "every job and cron occurrence to fire",
            interval_s=0.5,
        )
        # "no late duplicate": a window in which nothing may arrive, so a sleep on purpose
        time.sleep(2)
        return check_exactly_once(reader, once, crons, start)
    finally:
        reader.close()


def test_sigkill_failover_fires_everything_exactly_once(
    wide: CommonSettings, roles: list[Role]
) -> None:
    def kill_one(start: datetime) -> None:
        # when the fault strikes (a third into the load) is the scenario's, not a settling
        time.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds()) + LOAD_S / 3)
        roles[0].kill()

    _scenario(wide, roles, kill_one)
    assert roles[1].process.poll() is None, "the survivor must still run"


def test_zombie_scheduler_is_fenced(wide: CommonSettings, roles: list[Role]) -> None:
    def stop_and_continue(start: datetime) -> None:
        # when the fault strikes (a quarter into the load) is the scenario's, not a settling
        time.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds()) + LOAD_S / 4)
        roles[0].pause()
        owned_by(wide, 1)  # the other one took everything over
        # ... and has taken each partition in hand (its transactional producer is initialised,
        # so the zombie's is fenced) before the zombie wakes
        survivor = roles[1]
        survivor.wait_ready(
            lambda: owned_in_log(survivor) == set(range(wide.partitions)),
            60,
            "the survivor to own every partition",
        )
        roles[0].resume()  # whatever it had in hand must stay invisible

    _scenario(wide, roles, stop_and_continue)


def test_scale_out_during_load(wide: CommonSettings, roles: list[Role]) -> None:
    def add_third(start: datetime) -> None:
        # when the new member arrives (a third into the load) is the scenario's
        time.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds()) + LOAD_S / 3)
        roles.append(Role.start("sched-c", ["scheduler"], role_env(wide)))
        owned_by(wide, 3)

    _scenario(wide, roles, add_third)
