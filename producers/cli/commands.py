"""``duetime jobs|executions|dags|dlq``: argparse front ends of the REST API.

Each ``run_<command>`` builds its settings from the environment (and ``--url``/``--token``),
calls the API and prints a table or, with ``--json``, the API's JSON. An API error prints
``duetime <command>: <code>: <message>`` on stderr and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from duetime.core.config import Env

from . import render
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
        return action(api)
    except ApiCallError as exc:
        print(f"duetime {args.command}: {exc.message}", file=sys.stderr)
        return 1
    finally:
        api.close()


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
    create.add_argument("--name")
    when = create.add_mutually_exclusive_group()
    when.add_argument("--cron", help="5 fields, or 6 with seconds first")
    when.add_argument("--at", help="one-time: an RFC 3339 timestamp")
    create.add_argument("--timezone", help="IANA zone of --cron (default UTC)")
    target = create.add_mutually_exclusive_group()
    target.add_argument("--url-target", dest="target_url", help="http target URL")
    target.add_argument("--python", dest="target_python", help="python target package.mod:fn")
    target.add_argument("--kafka", dest="target_kafka", help="kafka target topic")
    create.add_argument("--method", help="http target method (default POST)")
    create.add_argument("--payload", help="JSON payload, @file or -")
    create.add_argument("--priority", choices=("critical", "high", "normal", "low"))
    create.add_argument("--max-retries", type=int)
    create.add_argument("--base-delay-s", type=float)
    create.add_argument("--timeout-s", type=float)
    create.add_argument("--misfire", choices=("skip", "run_once", "run_all"))
    create.add_argument("--overlap", choices=("skip", "allow", "queue_one"))
    create.add_argument("--job-id", help="client-chosen UUID (idempotent create)")
    create.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")

    for name, text in (("get", "show one job"),):
        p = sub.add_parser(name, help=text)
        _common(p)
        p.add_argument("job_id")
    lst = sub.add_parser("list", help="list jobs, newest first")
    _common(lst)
    lst.add_argument("--status")
    lst.add_argument("--priority")
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


def _create_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if args.body:
        loaded = _load_json(args.body, "--body")
        if not isinstance(loaded, dict):
            raise SystemExit("duetime: --body must be a JSON object")
        body.update(loaded)
    if args.name:
        body["name"] = args.name
    if args.cron:
        body["schedule"] = {"cron": args.cron, "timezone": args.timezone or "UTC"}
    elif args.at:
        body["schedule"] = {"at": args.at}
    if args.target_url:
        body["target"] = {"type": "http", "url": args.target_url}
        if args.method:
            body["target"]["method"] = args.method
    elif args.target_python:
        body["target"] = {"type": "python", "ref": args.target_python}
    elif args.target_kafka:
        body["target"] = {"type": "kafka", "topic": args.target_kafka}
    if args.payload is not None:
        body["payload"] = _load_json(args.payload, "--payload")
    retry = dict(body.get("retry") or {})
    if args.max_retries is not None:
        retry["max_retries"] = args.max_retries
    if args.base_delay_s is not None:
        retry["base_delay_s"] = args.base_delay_s
    if retry:
        body["retry"] = retry
    for key in ("priority", "timeout_s", "misfire", "overlap", "job_id"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.label:
        labels = dict(body.get("labels") or {})
        for item in args.label:
            key, sep, value = item.partition("=")
            if not sep:
                raise SystemExit(f"duetime: --label {item!r} is not KEY=VALUE")
            labels[key] = value
        body["labels"] = labels
    return body


def run_jobs(args: argparse.Namespace) -> int:
    def action(api: Api) -> int:
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
            params = {"status": args.status, "priority": args.priority, "name": args.name}
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
                print(f"{args.action} sent for job {out['job_id']} (status was {out['status']})")
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
                render.record(execution, skip=("attempts",))
                print("\nattempts:")
                render.table(
                    execution["attempts"],
                    ("attempt", "status", "queued_at", "started_at", "finished_at", "worker_id"),
                )
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
    for name, text in (
        ("get", "show a DAG and its jobs' status"),
        ("runs", "the DAG's runs with per-job status"),
        ("trigger", "start a run now"),
    ):
        p = sub.add_parser(name, help=text)
        _common(p)
        p.add_argument("dag_id")


def run_dags(args: argparse.Namespace) -> int:
    def action(api: Api) -> int:
        if args.action == "create":
            out = api.post("/v1/dags", _load_json(args.body, "the DAG"))
        elif args.action == "get":
            out = api.get(f"/v1/dags/{args.dag_id}")
            if not args.json:
                render.record(out, skip=("nodes",))
                print("\njobs:")
                render.table(out["nodes"], ("key", "job_id", "depends_on", "status"))
                return 0
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


def _replay_filter(args: argparse.Namespace, api: Api) -> dict[str, Any]:
    base = {
        k: v
        for k, v in (
            ("job_id", args.job_id),
            ("name", args.name),
            ("since", args.since),
            ("until", args.until),
        )
        if v is not None
    }
    if "until" not in base:
        # only what is dead now: a replay that dies again must not be chased round the loop
        base["until"] = datetime.now(UTC).isoformat()
    total = args.limit
    progress = render.Progress("replayed", total)
    replayed: list[str] = []
    skipped: list[dict[str, Any]] = []
    while total is None or len(replayed) < total:
        chunk = args.chunk if total is None else min(args.chunk, total - len(replayed))
        body = {**base, "limit": chunk, "include_replayed": args.include_replayed}
        out = api.post("/v1/dlq/replay", body)
        replayed += out["execution_ids"]
        skipped += out["skipped"]
        progress.advance(out["replayed"])
        # replayed ones drop out of the next query; with --include-replayed they would not
        if out["replayed"] < chunk or args.include_replayed:
            break
    progress.finish()
    return {"replayed": len(replayed), "execution_ids": replayed, "skipped": skipped}


def run_dlq(args: argparse.Namespace) -> int:
    def action(api: Api) -> int:
        if args.action == "list":
            items = api.pages("/v1/dlq", args.limit, job_id=args.job_id)
            if args.json:
                render.as_json(items)
            else:
                for item in items:
                    errors = item.get("errors") or []
                    last = errors[-1]["error"] if errors else {}
                    item["last_error"] = f"{last.get('type', '')}: {last.get('message', '')}"
                render.table(items, DLQ_COLUMNS)
            return 0
        if args.execution_ids:
            progress = render.Progress("replayed", len(args.execution_ids))
            ids = []
            for execution_id in args.execution_ids:
                ids += api.post(f"/v1/dlq/{execution_id}/replay")["execution_ids"]
                progress.advance(1)
            progress.finish()
            out: dict[str, Any] = {"replayed": len(ids), "execution_ids": ids, "skipped": []}
        else:
            out = _replay_filter(args, api)
        if args.json:
            render.as_json(out)
        else:
            print(f"replayed {out['replayed']} dead execution(s)")
            for s in out["skipped"]:
                print(f"skipped {s['execution_id']}: {s['reason']}")
        return 0

    return _run(args, action)
