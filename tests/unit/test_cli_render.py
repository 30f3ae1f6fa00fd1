"""The CLI's tables show hostile user data inert: no terminal escape, newline, C1 control or
bidi override reaches the terminal as itself; `get` views show every value whole, wrapped;
``--version`` (pure: no server)."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from duetime.producers.cli import commands, render

DANGEROUS = {chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))} | {
    "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"
}  # fmt: skip
SAFE = {"\t"}  # a tab is shown as itself: harmless in a table


@given(st.text(alphabet=st.sampled_from([*sorted(DANGEROUS), "a", "[", "2", "J"]), max_size=30))
@example("\x1f" * 7 + "\x80" * 10 + "\t")  # CI: a wrapped value's last chunk was a lone tab
def test_no_control_character_reaches_the_terminal(name: str) -> None:
    out = io.StringIO()
    render.table([{"name": name, "status": name}], ("name", "status"), out=out)
    render.record({"name": name}, out=out)
    shown = out.getvalue()
    assert not (set(shown) & (DANGEROUS - SAFE - {"\n"})), repr(shown)
    # header + one row + one record line: no injected lines (a long record value wraps onto
    # indented continuation lines, which cannot pass for a line of their own)
    assert sum(1 for line in shown.splitlines() if not line.startswith(" ")) == 3


def test_an_escape_is_shown_escaped() -> None:
    assert render.cell("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert render.cell("x\u202ey") == "x\\u202ey"
    # inside a JSON value (labels, a target) too: JSON escapes C0 only
    assert render.cell({"k": "\u202e\x85\u2028"}) == '{"k":"\\u202e\\u0085\\u2028"}'


# --- jobs create: the body the flags make ------------------------------------------------


def _reference_body(args: argparse.Namespace) -> dict[str, Any]:  # noqa: C901 (the old shape, on purpose)
    """The CLI's body before it was split into helpers (kept here as the specification)."""
    body: dict[str, Any] = dict(json.loads(args.body)) if args.body else {}
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
        body["payload"] = json.loads(args.payload)
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
            key, _, value = item.partition("=")
            labels[key] = value
        body["labels"] = labels
    return body


_text = st.none() | st.text(alphabet="abc:/=", max_size=5)
_json_doc = st.none() | st.integers() | st.text(max_size=3) | st.lists(st.integers(), max_size=2)
_bodies = st.none() | st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=3),
        "retry": st.none() | st.fixed_dictionaries({}, optional={"max_retries": st.integers()}),
        "labels": st.none() | st.dictionaries(st.sampled_from("xyz"), st.text(max_size=2)),
        "priority": st.sampled_from(["low", "high"]),
        "payload": _json_doc,
    },
).map(json.dumps)


@given(
    body=_bodies,
    name=_text,
    when=st.sampled_from(["cron", "at", None]),
    timezone=_text,
    target=st.sampled_from(["target_url", "target_python", "target_kafka", None]),
    method=_text,
    payload=st.none() | _json_doc.map(json.dumps),
    max_retries=st.none() | st.integers(0, 5),
    base_delay_s=st.none() | st.floats(0, 10),
    priority=st.none() | st.sampled_from(["critical", "normal"]),
    job_id=_text,
    labels=st.lists(st.sampled_from(["x=1", "y=", "z=a=b"]), max_size=3),
)
def test_create_flags_override_the_body_field_by_field(
    body: str | None,
    name: str | None,
    when: str | None,
    timezone: str | None,
    target: str | None,
    method: str | None,
    payload: str | None,
    max_retries: int | None,
    base_delay_s: float | None,
    priority: str | None,
    job_id: str | None,
    labels: list[str],
) -> None:
    args = argparse.Namespace(
        body=body,
        name=name,
        cron="0 3 * * *" if when == "cron" else None,
        at="2030-01-01T00:00:00Z" if when == "at" else None,
        timezone=timezone,
        target_url="http://h/x" if target == "target_url" else None,
        target_python="m:f" if target == "target_python" else None,
        target_kafka="t" if target == "target_kafka" else None,
        method=method,
        payload=payload,
        max_retries=max_retries,
        base_delay_s=base_delay_s,
        priority=priority,
        timeout_s=None,
        misfire=None,
        overlap=None,
        job_id=job_id,
        label=labels,
    )
    assert commands._create_body(args) == _reference_body(args)


def test_a_label_without_a_value_separator_is_refused() -> None:
    args = argparse.Namespace(
        **dict.fromkeys(
            ("body", "name", "cron", "at", "target_url", "target_python", "target_kafka"), None
        ),
        **dict.fromkeys(("payload", "max_retries", "base_delay_s", "priority", "job_id"), None),
        **dict.fromkeys(("timeout_s", "misfire", "overlap", "timezone", "method"), None),
        label=["novalue"],
    )
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        commands._create_body(args)


# --- get views: whole values, wrapped ----------------------------------------------------


_values = (
    st.none() | st.text(max_size=400) | st.dictionaries(st.text(max_size=8), st.text(max_size=40))
)


@given(
    record=st.dictionaries(st.text("abcdefghij_", min_size=1, max_size=12), _values, max_size=5),
    columns=st.integers(10, 200),
)
def test_a_record_shows_every_value_whole_within_the_width(
    record: dict[str, Any], columns: int
) -> None:
    out = io.StringIO()
    render.record(record, out=out, columns=columns)
    lines = out.getvalue().splitlines()
    width = max((len(k) for k in record), default=0)
    # nothing is cut: every character of every key and value is there, in order
    expected = "".join(f"{k}{render.full_text(v)}" for k, v in record.items())
    assert "".join("".join(lines).split()) == "".join(expected.split())
    # and each line fits the terminal (or the narrowest readable chunk past the keys)
    assert all(len(line) <= max(columns, width + 2 + 20) for line in lines)
    # one key line per key; the rest are continuations, indented past the keys
    assert sum(1 for line in lines if not line.startswith(" ")) == len(record)


def test_a_long_error_is_wrapped_not_cut() -> None:
    error = "ConnectError: " + " ".join(f"word{i}" for i in range(60))
    out = io.StringIO()
    render.record({"job_id": "j", "last_error": error}, out=out, columns=60)
    lines = out.getvalue().splitlines()
    assert len(lines) > 3 and "…" not in out.getvalue()
    assert "word59" in lines[-1] and lines[-1].startswith(" " * len("last_error  "))


def test_a_table_cell_is_still_cut_with_a_mark() -> None:
    assert render.cell("x" * 100) == "x" * (render.MAX_CELL - 1) + "…"


def test_version_prints_the_package_version() -> None:
    from duetime import __version__

    done = subprocess.run(
        [sys.executable, "-m", "duetime.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == f"duetime {__version__}"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["dags", "list", "--name", "etl", "--all"],
            {"action": "list", "name": "etl", "all": True},
        ),
        (["dlq", "list", "--name", "nightly"], {"action": "list", "name": "nightly"}),
        (["dlq", "replay", "--name", "n", "--yes"], {"action": "replay", "yes": True}),
        (["dlq", "replay", "--name", "n"], {"action": "replay", "yes": False}),
    ],
)
def test_the_new_arguments_parse(argv: list[str], expected: dict[str, Any]) -> None:
    from duetime.cli import build_parser

    args = vars(build_parser().parse_args(argv))
    assert {k: args[k] for k in expected} == expected


@pytest.mark.parametrize(
    ("answer", "confirmed"),
    [("y\n", True), ("YES\n", True), (" yes \n", True), ("n\n", False), ("\n", False), ("", False)],
)
def test_confirmation_needs_a_yes(
    answer: str,
    confirmed: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(answer))
    assert commands._confirm("replay 3 dead execution(s)?") is confirmed
    assert "replay 3 dead execution(s)? [y/N]" in capsys.readouterr().err


def test_a_progress_bar_has_its_total(capsys: pytest.CaptureFixture[str]) -> None:
    progress = render.Progress("replayed", 4)
    progress.advance(1)
    progress.advance(3)
    progress.finish()
    progress = render.Progress("replayed", 2)
    progress.advance(3)  # more than counted (one died again meanwhile): the total grows
    progress.finish()
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"[{'#' * 7}{'-' * 23}] 1/4 replayed",
        f"[{'#' * 30}] 4/4 replayed",
        f"[{'#' * 30}] 3/3 replayed",
    ]
