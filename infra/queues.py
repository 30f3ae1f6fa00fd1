"""``duetime queues create NAME`` and ``duetime queues list``: queues are their topics.

A queue exists when its four execution topics exist (``duetime.core.topics``); creating one
creates them with the configuration and replication of ``duetime topics create``. Its
partition count is ``DUETIME_PARTITIONS``: execution topics are co-partitioned with the jobs
topic (the scheduler that owns partition p writes its requests to partition p), so another
count would leave partitions unused or make the scheduler's writes fail; ``--partitions``
is accepted only with that value, and refused naming the reason otherwise.

Importing this module defines the arguments only; Kafka clients are built in ``run_queues``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from duetime.core.config import CommonSettings
from duetime.core.errors import ConfigError, ValidationError
from duetime.core.models import PRIORITY_ORDER
from duetime.core.topics import DEFAULT_QUEUE, Topics, check_queue

if TYPE_CHECKING:
    from duetime.core.lag import QueueLag


def add_queues_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="queues_action", metavar="action", required=True)
    create = sub.add_parser("create", help="create a queue: its four execution topics")
    create.add_argument("name", help="the queue's name: a-z, 0-9, '_' and '-', up to 48")
    create.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="partitions of its topics (default and only accepted value: DUETIME_PARTITIONS)",
    )
    listing = sub.add_parser("list", help="queues with their partitions and consumer lag")
    listing.add_argument(
        "--group",
        default=None,
        help="the worker group whose lag to show (default: <prefix>workers)",
    )


def check_partitions(requested: int | None, configured: int) -> int:
    """The partition count of a new queue's topics (see the module docstring)."""
    if requested is None or requested == configured:
        return configured
    raise ValidationError(
        f"--partitions {requested}: a queue's topics have DUETIME_PARTITIONS={configured} "
        "partitions, like the jobs topic (the scheduler that owns partition p writes to "
        "partition p of the queue's topics); set DUETIME_PARTITIONS for another count",
        field="partitions",
    )


@dataclass(frozen=True, slots=True)
class Created:
    queue: str
    created: list[str]
    existing: list[str]


def create_queue(
    common: CommonSettings,
    name: str,
    partitions: int | None = None,
    replication_factor: int | None = None,
) -> Created:
    """Create the queue's missing topics (idempotent). Raises ValidationError for a bad name
    or partition count, ConfigError when existing topics have another partition count."""
    from .topics import create_topics

    try:
        check_queue(name)
    except ValueError as exc:
        raise ValidationError(str(exc), field="name") from None
    count = check_partitions(partitions, common.partitions)
    specs = Topics(common.topic_prefix).queue_specs(name, count)
    created = create_topics(common, specs, replication_factor)
    return Created(name, created, [s.name for s in specs if s.name not in created])


@dataclass(frozen=True, slots=True)
class QueueRow:
    queue: str
    complete: bool
    """All four topics exist (else the queue does not exist: jobs naming it are refused)."""
    lag: QueueLag | None


def list_queues(common: CommonSettings, group: str) -> list[QueueRow]:
    """Every queue found among the topics (complete or not) with ``group``'s lag."""
    from duetime.core import kafka
    from duetime.core.lag import queue_lag

    topics = Topics(common.topic_prefix)
    admin = kafka.admin(common)
    found = topics.queues_in(admin.list_topics(timeout=10).topics)
    lags = {q.queue: q for q in queue_lag(common, admin, topics, group)}
    return [
        QueueRow(q, len(found[q]) == len(PRIORITY_ORDER), lags.get(q))
        for q in sorted(found, key=lambda q: (q != DEFAULT_QUEUE, q))
    ]


def run_queues(args: argparse.Namespace) -> int:
    from duetime.core.config import Env
    from duetime.core.logs import setup_logging

    from .topics import requested_replication

    env = Env()
    common = CommonSettings.from_env(env)
    setup_logging(common.log_format, common.log_level)
    if args.queues_action == "create":
        try:
            done = create_queue(
                common, args.name, args.partitions, requested_replication(env, common)
            )
        except (ValidationError, ConfigError) as exc:
            print(f"duetime queues create: {exc.message}", file=sys.stderr)
            return 2
        print(
            f"queue {done.queue}: {len(done.created)} topics created, "
            f"{len(done.existing)} already there"
        )
        return 0
    group = args.group or f"{common.topic_prefix}workers"
    print(f"{'QUEUE':24} {'PARTITIONS':>10} {'LAG':>8}  BY PRIORITY (lag of group {group})")
    for row in list_queues(common, group):
        lag = row.lag
        by_priority = (
            "" if lag is None else " ".join(f"{t.priority}={t.lag}" for t in lag.priorities)
        )
        partitions = 0 if lag is None else lag.partitions
        total = "-" if lag is None else str(lag.lag)
        state = "" if row.complete else "  (incomplete: topics missing, not usable)"
        print(f"{row.queue:24} {partitions:>10} {total:>8}  {by_priority}{state}")
    return 0
