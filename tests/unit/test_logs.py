"""Log lines carry user data: one record stays one line, secrets are redacted."""

from __future__ import annotations

import json
import logging

from duetime.core.logs import JsonFormatter, TextFormatter


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("t", logging.INFO, __file__, 1, msg, args, None)
    rec.__dict__.update(extra)
    return rec


def test_text_lines_escape_newlines_in_user_data() -> None:
    line = TextFormatter().format(
        record("job %s created", "evil\n2026-01-01 INFO fake: injected", job_id="a\nb")
    )
    assert "\n" not in line
    assert "evil\\n2026" in line and "job_id=a\\nb" in line


def test_a_traceback_cannot_start_a_line_of_its_own() -> None:
    try:
        raise ValueError("bad\nINFO injected")
    except ValueError:
        import sys

        rec = logging.LogRecord("t", logging.ERROR, __file__, 1, "boom", (), sys.exc_info())
    lines = TextFormatter().format(rec).splitlines()
    assert all(line.startswith("  ") for line in lines[1:])


def test_secrets_are_redacted_in_both_formats() -> None:
    rec = record("calling %s", "https://user:hunter2@h/p?api_key=s3cret")
    for formatter in (TextFormatter(), JsonFormatter()):
        out = formatter.format(rec)
        assert "hunter2" not in out and "s3cret" not in out
    json.loads(JsonFormatter().format(rec))
