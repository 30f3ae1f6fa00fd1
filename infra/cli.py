"""``duetime infra``, ``duetime topics create`` and ``duetime db migrate``."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger("duetime.infra")


def add_infra_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=("install", "up", "down", "status"),
        help="install: fetch the broker jars and PostgreSQL; up: start both and prepare topics "
        "and tables; down: stop both; status: say what runs",
    )
    parser.add_argument(
        "--brokers",
        type=int,
        choices=(1, 3),
        default=1,
        help="up: 1 broker (default) or a 3-node KRaft cluster (replication factor 3, "
        "min.insync.replicas 2) on the broker and controller ports plus 0, 2, 4; down and "
        "status cover both",
    )


def run_infra(args: argparse.Namespace) -> int:
    from duetime.core.config import CommonSettings, Env
    from duetime.core.logs import setup_logging

    from .stack import LocalStack, StackSettings
    from .topics import requested_replication

    env = Env()
    common = CommonSettings.from_env(env)
    setup_logging(common.log_format, common.log_level)
    stack = LocalStack(StackSettings.from_env(env, brokers=args.brokers))
    if args.action == "install":
        stack.install()
    elif args.action == "up":
        stack.up()
        common = stack.settings_for(common, env)
        stack.prepare(common, requested_replication(env, common))
        t = stack.timings_s
        print(f"kafka      {stack.bootstrap_servers}  (started in {t['kafka_start']:.1f} s)")
        print(f"postgresql {stack.database_url}  (started in {t['postgres_start']:.1f} s)")
    elif args.action == "down":
        stack.down()
    else:
        rows = [
            *stack.kafka_status(),
            ("postgresql", stack.database_url, stack.postgres.is_running()),
        ]
        for name, server, running in rows:
            print(f"{name:10} {server}: {'running' if running else 'stopped'}")
    return 0


def add_topics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("create", "list"))


def run_topics(args: argparse.Namespace) -> int:
    from duetime.core.config import CommonSettings, Env
    from duetime.core.logs import setup_logging
    from duetime.core.topics import Topics

    from .topics import create_topics, requested_replication

    env = Env()
    common = CommonSettings.from_env(env)
    setup_logging(common.log_format, common.log_level)
    specs = Topics(common.topic_prefix).specs(common.partitions)
    if args.action == "create":
        # unset DUETIME_REPLICATION_FACTOR: min(3, brokers), so 3 on a 3-broker cluster
        created = create_topics(common, specs, requested_replication(env, common))
        print(f"{len(created)} topics created, {len(specs) - len(created)} already there")
    for spec in specs:
        print(f"{spec.name:32} partitions={spec.partitions} {spec.config.get('cleanup.policy')}")
    return 0


def add_db_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("migrate",))


def run_db(args: argparse.Namespace) -> int:
    from duetime.core.config import CommonSettings, Env
    from duetime.core.logs import setup_logging

    from .migrate import migrate

    common = CommonSettings.from_env(Env())
    setup_logging(common.log_format, common.log_level)
    applied = migrate(common.database_url)
    print(f"{len(applied)} migrations applied" + (f": {', '.join(applied)}" if applied else ""))
    return 0
