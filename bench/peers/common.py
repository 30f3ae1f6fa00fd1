"""What the peer harnesses share: the workload plan, the statistics and the result shape.

Role: one definition of the two workloads (``burst``: N jobs due at one instant T;
``sustained``: jobs due at R per second for D seconds, job i due at T0 + i/R, each
inserted ``lead_s`` before it is due), one way to turn recorded job starts into the
result dictionary that ``bench/results/peers-<scenario>.json`` holds, and the small
process helpers the harnesses use.

Guarantees:
- Lateness is measured per job as (first start − due), from wall-clock readings taken
  on this one machine; a job that never started is *lost*, a job that started more than
  once counts once in *duplicates* per extra start.
- Percentiles are nearest-rank over every job that started (p50, p99, max), in ms.
- ``managed`` processes live in their own process group and are stopped (SIGTERM, then
  SIGKILL after a deadline) when the ``with`` block ends, however it ends.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from duetime.infra.process import terminate

REPO_ROOT = Path(__file__).resolve().parents[2]
PEERS_HOME = REPO_ROOT / ".duetime" / "peers"
SCENARIOS = ("burst", "sustained")


class PeerError(RuntimeError):
    """A peer could not be installed, started or measured."""


@dataclass(frozen=True)
class Workload:
    """The jobs a run schedules: how many, when each is due and how early it is inserted."""

    scenario: str
    jobs: int = 10_000
    rate_per_s: float = 350.0
    duration_s: float = 30.0
    lead_s: float | None = None
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"scenario must be one of {SCENARIOS}, not {self.scenario!r}")
        if self.scenario == "burst" and self.jobs < 1:
            raise ValueError("jobs must be at least 1")
        if self.scenario == "sustained" and (self.rate_per_s <= 0 or self.duration_s <= 0):
            raise ValueError("rate and duration_s must be positive")
        if self.timeout_s <= 0 or (self.lead_s is not None and self.lead_s < 0):
            raise ValueError("timeout_s must be positive and lead_s not negative")

    @property
    def total(self) -> int:
        """Number of jobs the run inserts."""
        if self.scenario == "burst":
            return self.jobs
        return int(self.rate_per_s * self.duration_s)

    @property
    def effective_lead_s(self) -> float:
        """Seconds between a job's insert and its due time.

        Default 10 s: River moves scheduled jobs to ``available`` in a maintenance loop
        that runs every 5 s and looks 5 s ahead, so a job inserted less than ~5 s before
        it is due can wait up to 5 s longer (River's docs say so). A burst also needs
        time to insert all N before T (Celery publishes ~1,000/s with two producers
        here): 1 s more per 1,000 jobs.
        """
        if self.lead_s is not None:
            return self.lead_s
        return 10.0 + (self.jobs / 1000.0 if self.scenario == "burst" else 0.0)

    def due_s(self, t0: float, seq: int) -> float:
        """Due time (unix seconds) of job ``seq`` when the first job is due at ``t0``."""
        return t0 if self.scenario == "burst" else t0 + seq / self.rate_per_s

    def describe(self) -> dict[str, Any]:
        """The workload's parameters for the result's ``config``."""
        d: dict[str, Any] = {"jobs": self.total, "lead_s": self.effective_lead_s}
        if self.scenario == "sustained":
            d |= {"rate_jobs_per_s": self.rate_per_s, "duration_s": self.duration_s}
        return d


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of an ascending list; NaN when empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def machine() -> dict[str, Any]:
    """Cores and memory of this box."""
    mem_kb = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    return {
        "cores": os.cpu_count(),
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "platform": platform.platform(),
        # Other work on the box skews every figure: the 1-minute load average at the end.
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def summarize(
    peer: str,
    workload: Workload,
    t0: float,
    starts: Iterable[tuple[int, float]],
    versions: dict[str, str],
    config: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The result dictionary of one peer's run from its (seq, start unix seconds) records."""
    total = workload.total
    first_start: dict[int, float] = {}
    runs: Counter[int] = Counter()
    for seq, at in starts:
        runs[seq] += 1
        if seq not in first_start or at < first_start[seq]:
            first_start[seq] = at
    valid = [s for s in first_start if 0 <= s < total]
    lateness_ms = sorted((first_start[s] - workload.due_s(t0, s)) * 1000.0 for s in valid)
    last_start = max((first_start[s] for s in valid), default=t0)
    # Throughput: distinct jobs started per second from the first due time to the last
    # start (for a burst: N / time until the last job ran).
    span_s = max(last_start - t0, 1e-3)
    duplicates = sum(n - 1 for s, n in runs.items() if n > 1)
    p99_ms = percentile(lateness_ms, 99)
    if workload.scenario == "sustained":
        # "Holds the rate": nothing lost, p99 lateness under 1 s, >= 95 % of the rate.
        held = (
            len(valid) == total
            and p99_ms < 1000.0
            and len(valid) / span_s >= 0.95 * workload.rate_per_s
        )
        extra = {"holds_rate": held, **(extra or {})}
    return {
        "peer": peer,
        "scenario": workload.scenario,
        "jobs": total,
        "duration_s": round(span_s, 3),
        "throughput_jobs_per_s": round(len(valid) / span_s, 1),
        "lateness_ms": {
            "p50": _round(percentile(lateness_ms, 50)),
            "p99": _round(p99_ms),
            "max": _round(lateness_ms[-1] if lateness_ms else math.nan),
        },
        "lost": total - len(valid),
        "duplicates": duplicates,
        "machine": machine(),
        "versions": versions,
        "config": {**workload.describe(), **config},
        **(extra or {}),
    }


def last_start_s(starts: Iterable[tuple[int, float]], total: int) -> float | None:
    """When the last of jobs 0 … ``total`` − 1 first started (unix seconds): the end of the
    window CPU is measured over, as for duetime; None if none started."""
    first_start: dict[int, float] = {}
    for seq, at in starts:
        if 0 <= seq < total:
            first_start[seq] = min(first_start.get(seq, at), at)
    return max(first_start.values()) if first_start else None


def _round(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 1)


def progress(peer: str, message: str) -> None:
    """One progress line on stderr, flushed at once."""
    print(f"[{time.strftime('%H:%M:%S')}] {peer}: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def managed(cmd: list[str], what: str, log_path: Path, stop_timeout_s: float = 15.0,
            **popen: Any) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    """Run ``cmd`` in its own session with output to ``log_path``; stop its group on exit."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=popen.pop("stdout", log),
            stderr=popen.pop("stderr", log),
            start_new_session=True, **popen,
        )  # fmt: skip
    try:
        yield proc
    finally:
        terminate(proc, stop_timeout_s, what, term_group=True)


def wait_for(predicate: Any, timeout_s: float, what: str, proc: subprocess.Popen[bytes] | None,
             log_path: Path | None = None, interval_s: float = 0.1) -> None:  # fmt: skip
    """Poll ``predicate`` until true; fail naming ``what`` on timeout or if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise PeerError(
                f"{what}: the process exited with {proc.returncode}" + _log_tail(log_path)
            )
        if time.monotonic() > deadline:
            raise PeerError(
                f"timed out after {timeout_s:.0f} s waiting for {what}" + _log_tail(log_path)
            )
        time.sleep(interval_s)


def _log_tail(log_path: Path | None) -> str:
    if log_path is None or not log_path.exists():
        return ""
    lines = log_path.read_text(errors="replace").splitlines()[-20:]
    return f"\n--- last lines of {log_path} ---\n" + "\n".join(lines)


def sigterm_as_keyboard_interrupt() -> None:
    """Make SIGTERM unwind like Ctrl-C, so every ``finally`` stops what it started."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
