"""``duetime jobs update`` and ``duetime jobs delete``: PATCH and DELETE /v1/jobs/{id}.

``update`` takes the flags of ``create`` (and ``--body``, the fields to change as JSON); only
the fields given are sent, each replacing the job's current one as a whole (``--label`` gives
the whole label map, ``--max-retries`` alone resets the other retry fields to their defaults).
``--if-revision`` sends ``If-Match``: the change is refused (412) if the job moved on.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from . import commands, render
from .client import Api

ACTIONS = ("update", "delete")


def add_arguments(sub: Any) -> None:
    """Register ``update`` and ``delete`` on the ``jobs`` subparsers."""
    update = sub.add_parser("update", help="change a job: the fields given replace its own")
    commands._common(update)
    update.add_argument("job_id")
    update.add_argument("--body", help="the fields to change as JSON, @file or - (flags override)")
    commands.job_flags(update)
    update.add_argument(
        "--if-revision", type=int, help="refuse if the job is no longer at this revision"
    )
    delete = sub.add_parser(
        "delete", help="cancel a job and hide it from lists (its history stays)"
    )
    commands._common(delete)
    delete.add_argument("job_id")


def run(
    api: Api, args: argparse.Namespace, body_of: Callable[[argparse.Namespace], dict[str, Any]]
) -> int:
    """``body_of``: the job body from the flags, as ``create`` builds it."""
    if args.action == "update":
        changes = {k: v for k, v in body_of(args).items() if k != "job_id"}
        if not changes:
            raise SystemExit("duetime: jobs update needs at least one field to change")
        headers = {} if args.if_revision is None else {"If-Match": f'"{args.if_revision}"'}
        job = api.call("PATCH", f"/v1/jobs/{args.job_id}", json=changes, headers=headers)
        verb = "updated"
    else:
        job = api.call("DELETE", f"/v1/jobs/{args.job_id}")
        verb = "deleted"
    if args.json:
        render.as_json(job)
    else:
        print(f"job {job.get('job_id')} {verb} (revision {job.get('revision')})")
        render.record(job, skip=("last_execution",))
    return 0
