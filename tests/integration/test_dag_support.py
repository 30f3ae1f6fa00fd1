"""Helpers of the DAG tests (no tests here).

The scheduler runs in the test process (``RunningScheduler``), the resolver as a real process
(``duetime resolver``), the worker is simulated on the wire (``bench.dag_harness.SimWorker``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from confluent_kafka.admin import AdminClient

from bench.dag_harness import SimWorker
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.infra.harness import wait_known as wait_known  # the shared harness's, re-exported
from tests.helpers import TopicReader, committed_offsets, wait_for

T = TypeVar("T")

TARGET = {"type": "python", "ref": "tests.tasks:noop"}
FAST_RETRY = {"max_retries": 2, "base_delay_s": 0.2, "max_delay_s": 1.0, "jitter": False}


def job(key: str, *depends_on: str, **fields: Any) -> dict[str, Any]:
    """A DAG member body."""
    return {
        "key": key,
        "name": f"dag-{key}",
        "target": TARGET,
        "retry": FAST_RETRY,
        "depends_on": list(depends_on),
        **fields,
    }


DIAMOND = [job("a"), job("b", "a"), job("c", "a"), job("d", "b", "c")]


@contextlib.contextmanager
def sim_worker(settings: CommonSettings, *args: Any, **kwargs: Any) -> Iterator[SimWorker]:
    worker = SimWorker(settings, *args, **kwargs)
    try:
        yield worker
    finally:
        worker.close()


def scheduler_read_past(settings: CommonSettings, messages: list[Any]) -> bool:
    """Whether the schedulers' group has committed its offsets past every one of ``messages``
    (Kafka messages of its input topics, e.g. a TopicReader's ``raw``). A scheduler commits
    them in the transaction that holds what it wrote in answer, so past this point its
    answers to those messages are on the topics."""
    wanted: dict[tuple[str, int], int] = {}
    for m in messages:
        where = (m.topic(), m.partition())
        wanted[where] = max(wanted.get(where, 0), m.offset() + 1)
    if not wanted:
        return True
    group = f"{settings.topic_prefix}schedulers"
    committed = committed_offsets(settings.bootstrap_servers, group, wanted)
    return all(offset >= wanted[where] for where, offset in committed.items())


def run_events(reader: TopicReader, run_id: str) -> list[dict[str, Any]]:
    return [e for e in reader.snapshot() if e["dag_run_id"] == run_id]


def completed(reader: TopicReader, run_id: str) -> dict[str, Any] | None:
    return next((e for e in run_events(reader, run_id) if e["kind"] == "completed"), None)


def wait_logged(predicate: Callable[[], T], timeout_s: float, what: str, *resolvers: Any) -> T:
    """``wait_for``, printing the tail of each resolver's log (a ``RoleProcess``; None is
    skipped) when the wait times out, so a CI failure says where the resolver stood."""
    try:
        return wait_for(predicate, timeout_s, what)
    except AssertionError:
        for resolver in resolvers:
            if resolver is not None and resolver.proc is not None:
                print(f"--- the end of {resolver.proc.log_path} ---")
                print(resolver.log()[-8000:])
        raise


def wait_completed(
    reader: TopicReader, run_id: str, timeout_s: float = 30, resolver: Any = None
) -> dict[str, Any]:
    event = wait_logged(
        lambda: completed(reader, run_id), timeout_s, f"run {run_id} to end", resolver
    )
    assert event is not None
    return event


def delete_internal_topics(settings: CommonSettings) -> None:
    """The resolver's own topics (faust made them): by_run, changelogs, the assignor's."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    names = {s.name for s in Topics(settings.topic_prefix).specs(1)}
    mine = [
        t
        for t in admin.list_topics(timeout=10).topics
        if t.startswith(settings.topic_prefix) and t not in names
    ]
    if mine:
        for future in admin.delete_topics(mine).values():
            with contextlib.suppress(Exception):
                future.result()
