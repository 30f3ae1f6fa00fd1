"""The ``duetime`` command: a thin dispatcher to each role's entry point.

Each command's module only declares its arguments at import time; the role's heavy imports
(Kafka clients, the web framework, faust) happen inside ``run_<command>``, so starting a worker
never loads the API.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from duetime import __version__
from duetime.core.errors import DuetimeError

# command -> (module, help). The module defines ``add_<command>_arguments(parser)`` and
# ``run_<command>(args) -> int`` (dashes in a command become underscores).
COMMANDS: dict[str, tuple[str, str]] = {
    "dev": ("duetime.devstack", "the whole local stack with a small demo workload"),
    "scheduler": ("duetime.schedulers.cli", "run a scheduler: owns partitions, fires due jobs"),
    "worker": ("duetime.consumers.worker.cli", "run a worker: executes due jobs under leases"),
    "resolver": ("duetime.consumers.resolver.cli", "run a DAG resolver: releases dependants"),
    "infra": ("duetime.infra.cli", "install, start, stop the local Kafka and PostgreSQL"),
    "topics": ("duetime.infra.cli", "create every topic: topics create"),
    "queues": ("duetime.infra.queues", "queues (worker pools' topics): queues create NAME | list"),
    "db": ("duetime.infra.cli", "database migrations: db migrate"),
    "projector": ("duetime.consumers.projector.cli", "run a projector: events → PostgreSQL"),
    "api": ("duetime.producers.api.cli", "serve the REST API (default http://127.0.0.1:8080)"),
    "jobs": ("duetime.producers.cli.commands", "jobs create|get|list|cancel|pause|resume|trigger"),
    "executions": ("duetime.producers.cli.commands", "a job's executions, or: get EXECUTION_ID"),
    "dags": ("duetime.producers.cli.commands", "dags create|list|get|runs|trigger"),
    "dlq": ("duetime.producers.cli.commands", "dead-lettered executions: dlq list|replay"),
    "calendars": ("duetime.producers.cli.schedules", "named calendars: create|list|get|delete"),
}


SERVER_MODULES = frozenset(
    {
        "aiohttp", "croniter", "fastapi", "faust", "httptools", "mode", "prometheus_client",
        "psycopg_pool", "starlette", "uvicorn", "uvloop",
    }
)  # fmt: skip
"""Top-level modules of the ``server`` extra: `pip install duetime` (the SDK and the CLI
client) does not bring them."""


def _entry(command: str) -> Callable[[argparse.Namespace], int]:
    module = importlib.import_module(COMMANDS[command][0])
    func: Callable[[argparse.Namespace], int] = getattr(module, f"run_{command.replace('-', '_')}")
    return func


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="duetime", description="duetime: a distributed job scheduler"
    )
    parser.add_argument("--version", action="version", version=f"duetime {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="command")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        getattr(module, f"add_{name.replace('-', '_')}_arguments")(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return _entry(args.command)(args)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in SERVER_MODULES:
            raise
        print(
            f"duetime {args.command}: this command runs a server role, and its dependencies "
            f"are not installed (no module {exc.name!r}): pip install 'duetime[server]'",
            file=sys.stderr,
        )
        return 2
    except DuetimeError as exc:
        print(f"duetime {args.command}: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
