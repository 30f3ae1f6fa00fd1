"""``duetime dev``'s follower: a summary every 10 s instead of a line per fire (issue 16:
14 minutes printed 10,879 lines), every fire with ``--verbose``, and a record it cannot read
counted and skipped (its thread died on a poison record)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.models import Priority, Trigger
from duetime.core.records import ExecutionRequest, HttpTarget
from duetime.devstack import FireSummary, _follow
from duetime.schemas.codec import Codec

T0 = 1_700_000_000_000
CODEC = Codec()


def request(name: str, priority: Priority, lateness_ms: int) -> bytes:
    return CODEC.dump(
        ExecutionRequest(
            execution_id="6f9f3c1e-5d1b-4c1e-9a63-6a0d7e1f2b10",
            job_id="6f9f3c1e-5d1b-4c1e-9a63-6a0d7e1f2b11",
            name=name,
            attempt=1,
            scheduled_at_ms=T0,
            due_at_ms=T0,
            emitted_at_ms=T0 + lateness_ms,
            priority=priority,
            target=HttpTarget(url="http://127.0.0.1:9/x"),
            payload_json="null",
            timeout_s=1.0,
            trigger=Trigger.SCHEDULE,
        )
    )


def test_a_period_is_one_line_with_counts_and_lateness(capsys: pytest.CaptureFixture[str]) -> None:
    summary = FireSummary()
    for i, lateness in enumerate((5, 7, 30)):
        _follow(CODEC, request(f"j{i}", Priority.HIGH, lateness), summary, verbose=False)
    _follow(CODEC, request("c", Priority.CRITICAL, 2), summary, verbose=False)
    _follow(CODEC, b"\x00garbage", summary, verbose=False)
    assert capsys.readouterr().out == ""  # nothing per fire
    line = summary.line()
    assert line == (
        "last 10 s: 4 fired (critical 1, high 3); lateness p50 7 ms, max 30 ms; "
        "1 unreadable records skipped; 4 fired since start"
    )
    assert summary.line() is None  # a quiet period prints nothing


def test_verbose_prints_every_fire_with_the_name_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    summary = FireSummary()
    _follow(CODEC, request("evil\x1b[2Jname\n", Priority.LOW, 3), summary, verbose=True)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "\x1b" not in out and "priority=low" in out


@given(st.binary(max_size=200))
def test_no_record_stops_the_follower(value: bytes) -> None:
    summary = FireSummary()
    _follow(CODEC, value, summary, verbose=False)
    assert summary.unreadable + summary.total == 1
