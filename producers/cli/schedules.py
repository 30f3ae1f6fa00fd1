"""``duetime calendars`` and ``duetime jobs backfill``: front ends of the schedule toolkit's
REST routes (``/v1/calendars``, ``POST /v1/jobs/{id}/backfill``).

``calendars create NAME --exclude 2026-12-25 --exclude 2026-12-24..2026-12-31
--exclude-weekday sat,sun --timezone Europe/Berlin`` creates a calendar (``--replace``: PUT,
replacing one that exists); ``list``, ``get NAME``, ``delete NAME``. A job uses one with
``jobs create --cron ... --calendar NAME``.

``jobs backfill ID --from T --to T`` asks for the backfill and follows its progress with a bar
until every occurrence ended (``--no-wait``: return at once; Ctrl-C stops following, not the
backfill, which goes on in the schedulers).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from . import commands, render
from .client import Api

CALENDAR_COLUMNS = ("name", "timezone", "exclude", "exclude_weekdays", "updated_at")
BACKFILL_ACTIONS = ("backfill", "backfills")
POLL_S = 1.0
"""How often ``jobs backfill`` asks for the progress."""
BAR_WIDTH = 30


# --- calendars -------------------------------------------------------------------------------


def add_calendars_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="action", required=True)
    create = sub.add_parser("create", help="create a calendar of excluded dates and weekdays")
    commands._common(create)
    create.add_argument("name")
    create.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="DATE|FIRST..LAST",
        help="a date (2026-12-25) or an inclusive range (2026-12-24..2026-12-31); repeatable",
    )
    create.add_argument(
        "--exclude-weekday",
        action="append",
        default=[],
        metavar="DAYS",
        help="weekdays to exclude, comma-separated (sat,sun); repeatable",
    )
    create.add_argument("--timezone", help="IANA zone in which dates are read (default UTC)")
    create.add_argument(
        "--replace", action="store_true", help="replace the calendar if it exists (PUT)"
    )
    lst = sub.add_parser("list", help="list calendars by name")
    commands._common(lst)
    for name, text in (("get", "show one calendar"), ("delete", "delete a calendar")):
        p = sub.add_parser(name, help=text)
        commands._common(p)
        p.add_argument("name")


def calendar_body(args: argparse.Namespace) -> dict[str, Any]:
    weekdays = [d.strip() for item in args.exclude_weekday for d in item.split(",") if d.strip()]
    body: dict[str, Any] = {
        "name": args.name,
        "exclude": list(args.exclude),
        "exclude_weekdays": weekdays,
    }
    if args.timezone:
        body.update(timezone=args.timezone)
    return body


def _calendar_row(calendar: dict[str, Any]) -> dict[str, Any]:
    return {
        **calendar,
        "exclude": ", ".join(calendar.get("exclude") or []),
        "exclude_weekdays": ",".join(calendar.get("exclude_weekdays") or []),
    }


def run_calendars(args: argparse.Namespace) -> int:
    def action(api: Api) -> int:
        if args.action == "create":
            body = calendar_body(args)
            if args.replace:
                out = api.call("PUT", f"/v1/calendars/{args.name}", json=body)
            else:
                out = api.post("/v1/calendars", body)
        elif args.action == "list":
            out = api.pages("/v1/calendars", None)
            if not args.json:
                render.table([_calendar_row(c) for c in out], CALENDAR_COLUMNS)
                return 0
        elif args.action == "get":
            out = api.get(f"/v1/calendars/{args.name}")
        else:
            out = api.call("DELETE", f"/v1/calendars/{args.name}")
            if not args.json:
                print(f"calendar {out.get('name')} deleted (jobs that use it keep their copy)")
                return 0
        render.as_json(out) if args.json else render.record(_calendar_row(out))
        return 0

    return commands._run(args, action)


# --- backfills ---------------------------------------------------------------------------------


def add_backfill_arguments(sub: Any) -> None:
    """Register ``backfill`` and ``backfills`` on the ``jobs`` subparsers."""
    backfill = sub.add_parser(
        "backfill", help="run each occurrence of a cron job in a range, with a progress bar"
    )
    commands._common(backfill)
    backfill.add_argument("job_id")
    backfill.add_argument("--from", dest="range_from", required=True, help="RFC 3339 timestamp")
    backfill.add_argument("--to", dest="range_to", required=True, help="RFC 3339 timestamp")
    backfill.add_argument(
        "--no-wait", action="store_true", help="return once asked; do not follow the progress"
    )
    listed = sub.add_parser("backfills", help="a job's backfills and their progress")
    commands._common(listed)
    listed.add_argument("job_id")


def run_backfill(api: Api, args: argparse.Namespace) -> int:
    if args.action == "backfills":
        items = api.get(f"/v1/jobs/{args.job_id}/backfills", limit=20).get("items", [])
        if args.json:
            render.as_json(items)
        else:
            for item in items:
                print(f"{item.get('backfill_id')}  {item.get('progress')}")
        return 0
    body = {"from": args.range_from, "to": args.range_to}
    out = api.post(f"/v1/jobs/{args.job_id}/backfill", body)
    if not args.no_wait:
        path = f"/v1/jobs/{args.job_id}/backfills/{out.get('backfill_id')}"
        out = follow(api, path, out, quiet=args.json)
    if args.json:
        render.as_json(out)
    return 0 if not out.get("failed") else 1


def follow(api: Api, path: str, backfill: dict[str, Any], *, quiet: bool) -> dict[str, Any]:
    """Poll the backfill until it is done, drawing its progress (on a terminal: one bar
    redrawn in place; elsewhere: a line per change). Ctrl-C stops following."""
    tty = commands._is_tty(sys.stderr)
    shown = ""
    try:
        while True:
            line = bar(backfill)
            if not quiet and line != shown:
                print(("\r" if tty else "") + line, end="" if tty else "\n", file=sys.stderr)
                shown = line
            if backfill.get("state") == "done":
                break
            time.sleep(POLL_S)
            backfill = api.get(path)
    except KeyboardInterrupt:
        print("\nstopped following; the backfill goes on", file=sys.stderr)
    if tty and not quiet:
        print(file=sys.stderr)
    return backfill


def bar(backfill: dict[str, Any]) -> str:
    """``[##########....................] 10/30  backfill ...: 10/30 done, ...``"""
    total = int(backfill.get("occurrences") or 0)
    done = int(backfill.get("done") or 0)
    filled = BAR_WIDTH if total == 0 else min(BAR_WIDTH, done * BAR_WIDTH // total)
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {backfill.get('progress', '')}"
