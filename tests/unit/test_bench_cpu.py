"""bench/cpu.py: CPU seconds over a benchmark's window, read from /proc.

The window arithmetic (readings → CPU between two instants) is pure and property-tested; the
meter is checked on a child process that burns a known amount of CPU when told.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.cpu import CpuMeter, Timeline, host_cpu_s, per_job, window_figures
from bench.http_rate import last_arrival_s
from bench.peers.common import last_start_s
from tests.helpers import wait_for

readings = st.lists(st.tuples(st.floats(0.01, 10.0), st.floats(0.0, 5.0)), min_size=1, max_size=30)


def _timeline(steps: list[tuple[float, float]]) -> Timeline:
    """Readings every ``dt`` seconds from t = 100, each ``dcpu`` more than the last."""
    line, at, cpu = Timeline(), 100.0, 0.0
    for dt, dcpu in steps:
        at, cpu = at + dt, cpu + dcpu
        line.record(at, cpu)
    return line


@given(readings, st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_windows_add_up_and_stay_within_the_readings(
    steps: list[tuple[float, float]], fa: float, fb: float, fc: float
) -> None:
    line = _timeline(steps)
    lo, hi = line.times_s[0], line.times_s[-1]
    a, b, c = sorted(lo + f * (hi - lo) for f in (fa, fb, fc))
    at = {x: line.at(x) for x in (a, b, c)}
    assert all(v is not None for v in at.values())
    ca, cb, cc = (float(at[x]) for x in (a, b, c))  # type: ignore[arg-type]
    # cumulative CPU never goes back, and two adjacent windows make the whole one
    assert line.cpu_s[0] <= ca <= cb <= cc <= line.cpu_s[-1]
    assert (cb - ca) + (cc - cb) == pytest.approx(cc - ca)


@given(readings)
def test_readings_are_returned_exactly_and_edges_outside_are_held(
    steps: list[tuple[float, float]],
) -> None:
    line = _timeline(steps)
    for at, cpu in zip(line.times_s, line.cpu_s, strict=True):
        assert line.at(at) == pytest.approx(cpu)
    assert line.at(line.times_s[0] - 50) == line.cpu_s[0]
    assert line.at(line.times_s[-1] + 50) == line.cpu_s[-1]


def test_interpolates_between_readings_and_never_goes_back() -> None:
    line = Timeline()
    assert line.at(5.0) is None
    line.record(10.0, 1.0)
    line.record(20.0, 3.0)
    assert line.at(15.0) == pytest.approx(2.0)
    # a tree read while a child's time moves to its parent can seem to go back: held
    line.record(30.0, 2.5)
    assert line.at(30.0) == pytest.approx(3.0)
    # a second reading at the same instant replaces the first
    line.record(30.0, 4.0)
    assert line.at(30.0) == pytest.approx(4.0) and len(line.times_s) == 3


_BURNER = """
import sys, time
for line in sys.stdin:
    until = time.process_time() + float(line)
    while time.process_time() < until:
        pass
    print("done", flush=True)
"""


class _Burner:
    """A child process that spends the CPU it is told to (a busy loop, not a sleep) and is
    idle in between: the meter reads it alone. Reading this test process instead counted
    every process a test module before had left under it (under ./run test a worker process
    runs several modules): a descendant that went away took its CPU out of the tree, the
    timeline held its old maximum, and a window of 0.4 s of burning read 0.03 s."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BURNER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def burn(self, cpu_s: float) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{cpu_s}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "done"

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(30) == 0


def _idle_until_read(meter: CpuMeter, after_s: float) -> float:
    """Wait until the meter's sampler has taken a reading later than ``after_s``; its time."""
    times = meter.timelines["burner"].times_s
    wait_for(lambda: times and times[-1] > after_s, 10, "a reading of the idle gap", 0.01)
    return times[-1]


def test_meter_charges_the_window_only_and_keeps_the_lifetime() -> None:
    burner = _Burner()
    try:
        meter = CpuMeter({"burner": burner.proc.pid}, interval_s=0.02)
        burner.burn(0.3)  # before the window: in the lifetime, not in the window
        meter.start()
        # idle readings on both sides of the window's edges: each gap lasts until it has a
        # reading, and the window's edges are those readings (idle on both sides: exact, not
        # interpolated)
        begin = _idle_until_read(meter, time.time())
        burner.burn(0.4)
        end = _idle_until_read(meter, time.time())
        burner.burn(0.3)  # after the window's end, before stop: not in the window either
        meter.stop()
    finally:
        burner.close()
    whole = meter.seconds()["burner"]
    window = meter.window(begin, end)["burner"]
    lifetime = meter.lifetime()["burner"]
    assert whole is not None and window is not None and lifetime is not None
    # the clock tick (10 ms) blurs the edges
    assert 0.3 <= window <= 0.55, window
    assert whole >= 0.6, whole
    assert lifetime >= whole + 0.3, (lifetime, whole)
    figures = window_figures(meter, begin, end)
    assert figures["cpu_s"] == {"burner": window}
    assert figures["cpu_s_lifetime"] == {"burner": lifetime}
    assert figures["cpu_window"]["span_s"] == pytest.approx(end - begin, abs=0.01)
    # the machine over the same window: its cores' time, the burn inside what was busy
    host = figures["host_cpu"]
    cores = os.cpu_count() or 1
    assert host["core_s"] == pytest.approx(cores * (end - begin), rel=0.25, abs=0.05)
    assert host["busy_s"] >= window - 0.05, (host, window)
    assert 0.0 <= host["steal_share"] <= 1.0 and 0.0 <= host["busy_share"] <= 1.0
    assert host["unmetered_s"] == pytest.approx(max(0.0, host["busy_s"] - window), abs=0.02)


def test_host_readings_grow_and_split_the_cores_time() -> None:
    first = host_cpu_s()
    assert first is not None  # Linux
    time.sleep(0.2)
    second = host_cpu_s()
    assert second is not None
    busy, steal, whole = (b - a for a, b in zip(first, second, strict=True))
    assert 0.0 <= busy <= whole and 0.0 <= steal <= whole
    assert whole == pytest.approx((os.cpu_count() or 1) * 0.2, rel=0.5, abs=0.05)


def test_a_process_added_inside_the_window_counts_from_zero_and_a_gone_one_is_none() -> None:
    busy = "import time\nt = time.process_time() + 0.3\nwhile time.process_time() < t: pass"
    child = subprocess.Popen([sys.executable, "-c", busy])
    meter = CpuMeter({"me": os.getpid()}, interval_s=0.02)
    meter.start()
    meter.add("child", child.pid)
    assert child.wait(60) == 0
    meter.stop()
    # reaped before stop(): its last reading is known, its figure at stop() is not guessed
    assert meter.seconds()["child"] is None
    assert meter.lifetime()["child"] is None
    assert meter.seconds()["me"] is not None
    window = meter.window(meter.started_s or 0.0, meter.stopped_s or 0.0)["child"]
    assert window is not None and window <= 0.5


def test_per_job_leaves_out_the_load_generator_and_unknown_processes() -> None:
    cpu = {"kafka": 2.0, "api": 1.0, "load_generator": 5.0, "gone": None}
    assert per_job(cpu, 1000, exclude=("load_generator",)) == {
        "system_cpu_s": 3.0,
        "cpu_ms_per_job": 3.0,
    }
    assert per_job({"gone": None}, 10) == {"system_cpu_s": None, "cpu_ms_per_job": None}
    assert per_job(cpu, 0)["cpu_ms_per_job"] is None


def test_window_ends_at_the_last_first_start_or_arrival() -> None:
    # job 1 started twice: its first start counts; seq 7 is not part of the workload
    starts = [(0, 10.0), (1, 12.0), (1, 15.0), (2, 11.0), (7, 99.0)]
    assert last_start_s(starts, total=3) == 12.0
    assert last_start_s([], total=3) is None
    records: list[dict[str, Any]] = [
        {"seq": 0, "arrival_ms": 1000.0},
        {"seq": 1, "arrival_ms": 3000.0},
        {"seq": 1, "arrival_ms": 2000.0},
        {"seq": 5, "arrival_ms": 9000.0},  # not created: not counted
        {"error": "bad body", "arrival_ms": 9500.0},
    ]
    assert last_arrival_s(records, {0, 1}) == 2.0
    assert last_arrival_s([], {0}) is None
