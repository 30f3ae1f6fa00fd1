"""``duetime jobs|executions|dags|dlq``: argparse front ends of the REST API.

Each ``run_<command>`` builds its settings from the environment (and ``--url``/``--token``),
calls the API and prints a table or, with ``--json``, the API's JSON. An API error prints
``duetime <command>: <code>: <message>`` on stderr and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from duetime.core.clock import SYSTEM_CLOCK
from duetime.core.config import Env

from . import render, schedules, update
from .client import Api, ApiCallError, CliSettings

JOB_COLUMNS = ("job_id", "name", "status", "priority", "next_run_at", "last_run")
EXECUTION_COLUMNS = (
    "execution_id",
    "status",
    "attempt",
    "scheduled_at",
    "started_at",
    "finished_at",
    "lateness_ms",
    "worker_id",
)
DLQ_COLUMNS = ("execution_id", "job_id", "name", "dead_at", "attempts", "last_error", "replayed_at")
DAG_COLUMNS = ("dag_id", "name", "schedule", "node_count", "last_run", "created_at")
# the exit status of a process killed by SIGPIPE (128 + 13), as `head` expects of a writer
EXIT_CLOSED_PIPE = 141


# --- shared plumbing ---------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    parser.add_argument("--url", help="the API (default DUETIME_API_URL or http://127.0.0.1:8080)")
    parser.add_argument("--token", help="bearer token (default DUETIME_API_TOKEN)")


def _run(args: argparse.Namespace, action: Callable[[Api], int]) -> int:
    settings = CliSettings.from_env(Env())
    if args.url:
        settings = CliSettings(args.url.rstrip("/"), settings.token, settings.timeout_s)
    if args.token:
        settings = CliSettings(settings.api_url, args.token, settings.timeout_s)
    api = Api(settings)
    try:
        rc = action(api)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return rc
    except BrokenPipeError:
        return _closed_pipe()
    except ApiCallError as exc:
        print(f"duetime {args.command}: {exc.message}", file=sys.stderr)
        return 1
    finally:
        api.close()


def _closed_pipe() -> int:
    """The reader went away (``duetime jobs list | head``): stop quietly. What is still
    buffered goes to /dev/null, so the exit flush does not print a second traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file (a test's capture): nothing to do
        pass
    return EXIT_CLOSED_PIPE


def _load_json(text: str, what: str) -> Any:
    """JSON from an argument, ``@file`` or ``-`` (stdin)."""
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        text = Path(text[1:]).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SystemExit(f"duetime: {what} is not JSON: {exc}") from None


def _job_row(job: dict[str, Any]) -> dict[str, Any]:
    last = job.get("last_execution") or {}
    return {**job, "last_run": last.get("status")}


# --- jobs ------------------------------------------------------------------------------------


def add_jobs_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="action", required=True)
    create = sub.add_parser("create", help="create a job (flags, or a whole body with --body)")
    _common(create)
    create.add_argument("--body", help="the job as JSON, @file or - for stdin (flags override)")
    job_flags(create)
    create.add_argument("--job-id", help="client-chosen UUID (idempotent create)")
    create_only_flags(create)
    update.add_arguments(sub)
    schedules.add_backfill_arguments(sub)

    for name, text in (("get", "show one job"),):
        p = sub.add_parser(name, help=text)
        _common(p)
        p.add_argument("job_id")
    lst = sub.add_parser("list", help="list jobs, newest first")
    _common(lst)
    lst.add_argument("--status")
    lst.add_argument("--priority")
    lst.add_argument("--queue", help="jobs of this queue only")
    lst.add_argument("--name")
    lst.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    lst.add_argument("--all", action="store_true", help="every job (follows the pages)")
    for name, text in (
        ("cancel", "no further runs; a running execution finishes"),
        ("pause", "stop firing"),
        ("resume", "restart firing (applies the misfire policy)"),
        ("trigger", "run once now"),
    ):
        p = sub.add_parser(name, help=text)
        _common(p)
        p.add_argument("job_id")


def job_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of a job's fields (``jobs create``, ``jobs update``)."""
    parser.add_argument("--name")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--cron", help="5 fields, or 6 with seconds first")
    when.add_argument("--at", help="one-time: an RFC 3339 timestamp")
    parser.add_argument("--timezone", help="IANA zone of --cron (default UTC)")
    parser.add_argument(
        "--jitter-s", type=float, metavar="SECONDS", help="--cron: fire each run up to this late"
    )
    parser.add_argument("--calendar", metavar="NAME", help="--cron: skip the calendar's dates")
    parser.add_argument("--start-at", metavar="TIME", help="--cron: no run before (RFC 3339)")
    parser.add_argument("--end-at", metavar="TIME", help="--cron: no run after (RFC 3339)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--url-target", dest="target_url", help="http target URL")
    target.add_argument("--python", dest="target_python", help="python target package.mod:fn")
    target.add_argument("--kafka", dest="target_kafka", help="kafka target topic")
    parser.add_argument("--method", help="http target method (default POST)")
    parser.add_argument("--payload", help="JSON payload, @file or -")
    parser.add_argument("--priority", choices=("critical", "high", "normal", "low"))
    parser.add_argument(
        "--queue", help="the queue whose workers run it (default: default; it must exist)"
    )
    parser.add_argument("--max-retries", type=int)
    parser.add_argument("--base-delay-s", type=float)
    parser.add_argument("--timeout-s", type=float)
    parser.add_argument(
        "--start-within",
        dest="start_within_s",
        type=float,
        metavar="SECONDS",
        help="not started this long after its due time: the execution ends expired, unrun",
    )
    parser.add_argument("--misfire", choices=("skip", "run_once", "run_all"))
    parser.add_argument("--overlap", choices=("skip", "allow", "queue_one"))
    limits = parser.add_argument_group("limits per key (the key may use {payload.field})")
    limits.add_argument("--concurrency-key", metavar="TEMPLATE", help="e.g. tenant-{payload.t}")
    limits.add_argument("--concurrency-limit", type=int, metavar="N", help="at most N at once")
    limits.add_argument("--rate-key", metavar="TEMPLATE", help="the rate limit's key")
    limits.add_argument("--rate-per-s", type=float, metavar="R", help="starts a second")
    limits.add_argument("--rate-burst", type=int, metavar="B", help="starts at once")
    limits.add_argument(
        "--fairness-key", metavar="TEMPLATE", help="e.g. {payload.tenant}: keys take turns"
    )
    limits.add_argument("--fairness-weight", type=int, metavar="W", help="the key's share (1..100)")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")


def create_only_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of ``jobs create`` alone: unique / debounce (applied when a job is created) and
    the retry policy's error classes (issue 18)."""
    keyed = parser.add_argument_group("unique jobs and debounce (the key may use {payload.field})")
    once = keyed.add_mutually_exclusive_group()
    once.add_argument(
        "--unique-key",
        metavar="TEMPLATE",
        help="a create inside the window returns the first job of the key and creates nothing",
    )
    once.add_argument(
        "--debounce-key",
        metavar="TEMPLATE",
        help="the last create inside the window wins: it runs at the window's end",
    )
    keyed.add_argument("--window-s", type=float, metavar="SECONDS", help="the key's window")
    retry = parser.add_argument_group("retry by error class")
    retry.add_argument(
        "--non-retryable-status",
        type=int,
        action="append",
        metavar="STATUS",
        help="an HTTP status that goes to the DLQ at once (repeatable)",
    )
    retry.add_argument(
        "--non-retryable-error",
        action="append",
        metavar="TYPE",
        help="an exception type (ValueError, pkg.mod:Cls) not retried (repeatable)",
    )
    retry.add_argument(
        "--ignore-retry-after",
        action="store_true",
        help="the backoff applies even when an HTTP target answers Retry-After",
    )


def _create_only(args: argparse.Namespace, retry: dict[str, Any] | None) -> dict[str, Any]:
    """unique / debounce and the retry fields from :func:`create_only_flags` (getattr: a
    caller's own namespace may predate them)."""
    out: dict[str, Any] = {}
    for directive in ("unique", "debounce"):
        key = getattr(args, f"{directive}_key", None)
        if key is not None:
            out[directive] = {"key": key, "window_s": getattr(args, "window_s", None)}
    extra = {
        "non_retryable_http_statuses": getattr(args, "non_retryable_status", None),
        "non_retryable_errors": getattr(args, "non_retryable_error", None),
        "respect_retry_after": False if getattr(args, "ignore_retry_after", False) else None,
    }
    given = {k: v for k, v in extra.items() if v is not None}
    if given:
        out["retry"] = {**(retry or {}), **given}
    return out


def _create_body(args: argparse.Namespace) -> dict[str, Any]:
    """The job body: ``--body`` first, each flag given overriding its field."""
    body = _base_body(args.body)
    # a JSON null given with --payload is a value (the payload null), not an absent flag
    payload = {} if args.payload is None else {"payload": _load_json(args.payload, "--payload")}
    flags: dict[str, Any] = {
        "name": args.name or None,
        "schedule": _schedule_flag(args),
        "target": _target_flag(args),
        "retry": _retry_flag(args, body.get("retry")),
        "labels": _labels_flag(args.label, body.get("labels")),
        **{key: getattr(args, key) for key in ("priority", "timeout_s", "misfire", "overlap")},
        # getattr with a default: a caller's own namespace (tests, scripts) may predate it
        "start_within_s": getattr(args, "start_within_s", None),
        "queue": getattr(args, "queue", None),
        **_limit_flags(args),
        "job_id": args.job_id,
    }
    created = {**body, **payload, **{k: v for k, v in flags.items() if v is not None}}
    return {**created, **_create_only(args, created.get("retry"))}


def _limit_flags(args: argparse.Namespace) -> dict[str, Any]:
    """``concurrency`` / ``rate_limit`` / ``fairness`` from their flags, when any of a limit's
    is given (one missing is then named by the API's 422)."""
    flags = {
        "concurrency": {"key": "concurrency_key", "limit": "concurrency_limit"},
        "rate_limit": {"key": "rate_key", "per_s": "rate_per_s", "burst": "rate_burst"},
        "fairness": {"key": "fairness_key", "weight": "fairness_weight"},
    }
    out: dict[str, Any] = {}
    for limit, names in flags.items():
        # getattr with a default: a caller's own namespace (tests, scripts) may predate them
        given = {k: v for k, name in names.items() if (v := getattr(args, name, None)) is not None}
        if given:
            out[limit] = given
    return out


def _base_body(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    loaded = _load_json(raw, "--body")
    if not isinstance(loaded, dict):
        raise SystemExit("duetime: --body must be a JSON object")
    return loaded


def _schedule_flag(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.cron:
        # getattr with a default: a caller's own namespace (tests, scripts) may predate them
        extra = {
            key: value
            for key in ("jitter_s", "calendar", "start_at", "end_at")
            if (value := getattr(args, key, None)) is not None
        }
        return {"cron": args.cron, "timezone": args.timezone or "UTC", **extra}
    return {"at": args.at} if args.at else None


def _target_flag(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.target_url:
        method = {"method": args.method} if args.method else {}
        return {"type": "http", "url": args.target_url, **method}
    if args.target_python:
        return {"type": "python", "ref": args.target_python}
    if args.target_kafka:
        return {"type": "kafka", "topic": args.target_kafka}
    return None


def _retry_flag(args: argparse.Namespace, base: Any) -> dict[str, Any] | None:
    """``--body``'s retry with ``--max-retries``/``--base-delay-s`` over it; None when no
    retry was given at all (the API's default applies)."""
    flags = {
        k: v
        for k, v in (("max_retries", args.max_retries), ("base_delay_s", args.base_delay_s))
        if v is not None
    }
    retry = {**dict(base or {}), **flags}
    return retry or None


def _labels_flag(items: list[str], base: Any) -> dict[str, str] | None:
    if not items:
        return None
    labels = dict(base or {})
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"duetime: --label {item!r} is not KEY=VALUE")
        labels[key] = value
    return labels


def run_jobs(args: argparse.Namespace) -> int:
    def action(api: Api) -> int:
        if args.action in update.ACTIONS:
            return update.run(api, args, _create_body)
        if args.action in schedules.BACKFILL_ACTIONS:
            return schedules.run_backfill(api, args)
        if args.action == "create":
            out = api.post("/v1/jobs", _create_body(args))
            render.as_json(out) if args.json else render.record(out)
        elif args.action == "get":
            job = api.get(f"/v1/jobs/{args.job_id}")
            if args.json:
                render.as_json(job)
            else:
                render.record(job, skip=("last_execution",))
                last = job.get("last_execution")
                if last:
                    print("\nlast execution:")
                    render.table([last], EXECUTION_COLUMNS)
        elif args.action == "list":
            params = {
                "status": args.status,
                "priority": args.priority,
                "name": args.name,
                "queue": getattr(args, "queue", None),
            }
            jobs = api.pages("/v1/jobs", None if args.all else args.limit, **params)
            if args.json:
                render.as_json(jobs)
            else:
                render.table([_job_row(j) for j in jobs], JOB_COLUMNS)
        else:
            out = api.post(f"/v1/jobs/{args.job_id}/{args.action}")
            if args.json:
                render.as_json(out)
            else:
                job_id, status = out.get("job_id"), out.get("status")
                print(f"{args.action} sent for job {job_id} (status was {status})")
        return 0

    return _run(args, action)


# --- executions ------------------------------------------------------------------------------


def add_executions_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument(
        "target",
        nargs="+",
        metavar="JOB_ID | get EXECUTION_ID",
        help="a job's executions (newest first), or one execution with its attempts",
    )
    parser.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")


def run_executions(args: argparse.Namespace) -> int:
    def action(api: Api) -> int:
        if args.target[0] == "get":
            if len(args.target) != 2:
                raise SystemExit("usage: duetime executions get EXECUTION_ID")
            execution = api.get(f"/v1/executions/{args.target[1]}")
            if args.json:
                render.as_json(execution)
            else:
                render.record(execution, skip=("attempts", "traceback"))
                print("\nattempts:")
                render.table(
                    execution.get("attempts") or [],
                    (
                        "attempt",
                        "status",
                        "queued_at",
                        "started_at",
                        "finished_at",
                        "worker_id",
                        "error",
                    ),
                )
                trace = execution.get("traceback")
                if trace:
                    print("\ntraceback (latest attempt):")
                    render.lines(str(trace))
            return 0
        if len(args.target) != 1:
            raise SystemExit("usage: duetime executions JOB_ID")
        items = api.pages(f"/v1/jobs/{args.target[0]}/executions", args.limit)
        render.as_json(items) if args.json else render.table(items, EXECUTION_COLUMNS)
        return 0

    return _run(args, action)


# --- dags ------------------------------------------------------------------------------------


def add_dags_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="action", required=True)
    create = sub.add_parser("create", help="create a DAG from its JSON body (API.md)")
    _common(create)
    create.add_argument("body", help="the DAG as JSON, @file or - for stdin")
    lst = sub.add_parser("list", help="list DAGs, newest first, with each one's latest run")
    _common(lst)
    lst.add_argument("--name", help="name contains this (case-insensitive)")
    lst.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    lst.add_argument("--all", action="store_true", help="every DAG (follows the pages)")
    for name, text in (
        ("get", "show a DAG and its jobs' status"),
        ("runs", "the DAG's runs with per-job status"),
        ("trigger", "start a run now"),
    ):
        p = sub.add_parser(name, help=text)
        _common(p)
        p.add_argument("dag_id")
    retry = sub.add_parser(
        "retry", help="repair a failed run: re-run its dead jobs and carry on downstream"
    )
    _common(retry)
    retry.add_argument("dag_id")
    retry.add_argument("dag_run_id")


def _dag_row(dag: dict[str, Any]) -> dict[str, Any]:
    last = dag.get("last_run") or {}
    return {**dag, "last_run": last.get("status")}


def run_dags(args: argparse.Namespace) -> int:
    def action(api: Api) -> int:
        if args.action == "create":
            out = api.post("/v1/dags", _load_json(args.body, "the DAG"))
        elif args.action == "list":
            dags = api.pages("/v1/dags", None if args.all else args.limit, name_contains=args.name)
            render.as_json(dags) if args.json else render.table(
                [_dag_row(d) for d in dags], DAG_COLUMNS
            )
            return 0
        elif args.action == "get":
            out = api.get(f"/v1/dags/{args.dag_id}")
            if not args.json:
                render.record(out, skip=("nodes",))
                print("\njobs:")
                render.table(out.get("nodes") or [], ("key", "job_id", "depends_on", "status"))
                return 0
        elif args.action == "retry":
            out = api.post(f"/v1/dags/{args.dag_id}/runs/{args.dag_run_id}/retry")
        elif args.action == "runs":
            runs = api.pages(f"/v1/dags/{args.dag_id}/runs", 50)
            if args.json:
                render.as_json(runs)
            else:
                render.table(
                    runs, ("dag_run_id", "status", "started_at", "finished_at", "node_statuses")
                )
            return 0
        else:
            out = api.post(f"/v1/dags/{args.dag_id}/trigger")
        render.as_json(out) if args.json else render.record(out)
        return 0

    return _run(args, action)


# --- dlq -------------------------------------------------------------------------------------


def add_dlq_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="action", required=True)
    lst = sub.add_parser("list", help="dead-lettered executions, newest first")
    _common(lst)
    lst.add_argument("--job-id")
    lst.add_argument("--name", help="the job's name, exactly")
    lst.add_argument("--limit", type=int, default=50)
    replay = sub.add_parser(
        "replay", help="replay dead executions: the ids given, or every one matching a filter"
    )
    _common(replay)
    replay.add_argument("execution_ids", nargs="*", metavar="EXECUTION_ID")
    replay.add_argument("--job-id")
    replay.add_argument("--name")
    replay.add_argument("--since", help="dead at or after (RFC 3339)")
    replay.add_argument("--until", help="dead before (RFC 3339)")
    replay.add_argument("--include-replayed", action="store_true")
    replay.add_argument("--limit", type=int, default=None, help="replay at most this many")
    replay.add_argument("--chunk", type=int, default=200, help="dead letters per request")
    replay.add_argument(
        "--yes", "-y", action="store_true", help="replay a filter's matches without asking"
    )


@dataclass(frozen=True, slots=True)
class Replayed:
    """The API's answer to a replay (``ReplayOut``), or the sum of several."""

    execution_ids: list[str] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    replayed: int = 0

    @classmethod
    def from_json(cls, out: dict[str, Any]) -> Replayed:
        ids = list(out.get("execution_ids") or [])
        return cls(ids, list(out.get("skipped") or []), int(out.get("replayed", len(ids))))

    def __add__(self, other: Replayed) -> Replayed:
        ids = self.execution_ids + other.execution_ids
        return Replayed(ids, self.skipped + other.skipped, len(ids))

    def to_json(self) -> dict[str, Any]:
        return {
            "replayed": self.replayed,
            "execution_ids": self.execution_ids,
            "skipped": self.skipped,
        }


def _iso_now() -> str:
    return datetime.fromtimestamp(SYSTEM_CLOCK.now_ms() / 1000, tz=UTC).isoformat()


def _replay_filter(args: argparse.Namespace, api: Api) -> Replayed:
    # only what is dead now (--until defaults to now): a replay that dies again must not be
    # chased round the loop
    until = args.until if args.until is not None else _iso_now()
    given = (("job_id", args.job_id), ("name", args.name), ("since", args.since))
    base = {**{k: v for k, v in given if v is not None}, "until": until}
    matching = _count_matching(api, args, until)
    if matching == 0:
        return Replayed()
    if not args.yes and not _confirm(f"replay {matching} dead execution(s)?"):
        raise SystemExit("duetime dlq replay: not confirmed; nothing replayed")
    total = args.limit
    progress = render.Progress("replayed", matching)
    done = Replayed()
    while total is None or done.replayed < total:
        chunk = args.chunk if total is None else min(args.chunk, total - done.replayed)
        body = {**base, "limit": chunk, "include_replayed": args.include_replayed}
        out = Replayed.from_json(api.post("/v1/dlq/replay", body))
        done += out
        progress.advance(out.replayed)
        # replayed ones drop out of the next query; with --include-replayed they would not
        if out.replayed < chunk or args.include_replayed:
            break
    progress.finish()
    return done


def _count_matching(api: Api, args: argparse.Namespace, until: str) -> int:
    """How many dead letters the filter replays (the progress bar's total): the listing
    filters job and name; the dead-at window is applied here, to the same instants."""
    items = api.pages(
        "/v1/dlq",
        None,
        job_id=args.job_id,
        name=args.name,
        include_replayed="true" if args.include_replayed else "false",
    )
    lo = None if args.since is None else _instant(args.since, "--since")
    hi = _instant(until, "--until")
    count = sum(
        1
        for item in items
        if (lo is None or _instant(item["dead_at"], "dead_at") >= lo)
        and _instant(item["dead_at"], "dead_at") < hi
    )
    return count if args.limit is None else min(count, args.limit)


def _instant(text: str, what: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(f"duetime dlq replay: {what} is not an RFC 3339 timestamp") from None
    if value.tzinfo is None:
        raise SystemExit(f"duetime dlq replay: {what} needs a time zone offset")
    return value


def _confirm(question: str) -> bool:
    """Ask on the terminal; anything but y/yes, or no answer at all, is no."""
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except (OSError, ValueError):  # no usable stdin (closed, or a detached job)
        answer = ""
    if not answer or not _is_tty(sys.stdin):  # an answer from a pipe was not echoed
        print(file=sys.stderr)
    return answer.strip().lower() in ("y", "yes")


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _last_error(item: dict[str, Any]) -> str:
    errors = item.get("errors") or []
    last = (errors[-1].get("error") if errors else None) or {}
    return f"{last.get('type', '')}: {last.get('message', '')}"


def _replay_ids(execution_ids: list[str], api: Api) -> Replayed:
    """Replay these dead letters one by one (skipped ones are 409 errors, not answers)."""
    progress = render.Progress("replayed", len(execution_ids))
    done = Replayed()
    for execution_id in execution_ids:
        out = Replayed.from_json(api.post(f"/v1/dlq/{execution_id}/replay"))
        done += Replayed(out.execution_ids)
        progress.advance(1)
    progress.finish()
    return done


def run_dlq(args: argparse.Namespace) -> int:
    def action(api: Api) -> int:
        if args.action == "list":
            items = api.pages("/v1/dlq", args.limit, job_id=args.job_id, name=args.name)
            if args.json:
                render.as_json(items)
            else:
                render.table(
                    [{**item, "last_error": _last_error(item)} for item in items], DLQ_COLUMNS
                )
            return 0
        out = (
            _replay_ids(args.execution_ids, api)
            if args.execution_ids
            else _replay_filter(args, api)
        )
        if args.json:
            render.as_json(out.to_json())
        else:
            print(f"replayed {out.replayed} dead execution(s)")
            for s in out.skipped:
                print(f"skipped {s.get('execution_id')}: {s.get('reason')}")
        return 0

    return _run(args, action)
