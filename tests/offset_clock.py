"""A scheduler process whose wall clock is off: ``python -m tests.offset_clock -m duetime.cli
scheduler`` (the harness's ``RoleProc(..., python_args=["-m", "tests.offset_clock"])``).

An operator's badly set clock, without touching the machine's: the scheduler gets a Clock
that adds an offset to the system clock (its monotonic clock and the broker's are untouched,
as in issue 14 item 8). Production code has no switch for this: the launcher passes the clock
to ``run_scheduler`` as any embedding would.

- ``DUETIME_TEST_CLOCK_OFFSET_MS``: the offset from the start (default 0);
- SIGUSR1 steps the clock by ``DUETIME_TEST_CLOCK_STEP_MS`` (someone sets the clock wrong
  while the scheduler runs); SIGUSR2 puts it right again (offset 0).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from types import FrameType

from duetime.core.clock import SYSTEM_CLOCK, Clock


class OffsetClock:
    """The system clock plus an offset that can change at any time (thread-safe)."""

    def __init__(self, offset_ms: int = 0, base: Clock = SYSTEM_CLOCK) -> None:
        self._base = base
        self._offset_ms = offset_ms
        self._lock = threading.Lock()

    @property
    def offset_ms(self) -> int:
        with self._lock:
            return self._offset_ms

    def set_offset(self, offset_ms: int) -> None:
        with self._lock:
            self._offset_ms = offset_ms

    def now_ms(self) -> int:
        return self._base.now_ms() + self.offset_ms


def _env_ms(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a whole number of milliseconds") from None


def main(argv: list[str]) -> int:
    if argv[:3] != ["-m", "duetime.cli", "scheduler"]:
        raise SystemExit(
            f"usage: python -m tests.offset_clock -m duetime.cli scheduler (not {argv})"
        )
    from duetime.schedulers.cli import add_scheduler_arguments, run_scheduler

    parser = argparse.ArgumentParser(prog="offset-clock scheduler")
    add_scheduler_arguments(parser)
    args = parser.parse_args(argv[3:])
    clock = OffsetClock(_env_ms("DUETIME_TEST_CLOCK_OFFSET_MS", 0))
    step_ms = _env_ms("DUETIME_TEST_CLOCK_STEP_MS", 30_000)

    def step(_sig: int, _frame: FrameType | None) -> None:
        clock.set_offset(step_ms)
        print(f"offset clock: stepped to {step_ms:+d} ms", flush=True)

    def right(_sig: int, _frame: FrameType | None) -> None:
        clock.set_offset(0)
        print("offset clock: set right (+0 ms)", flush=True)

    signal.signal(signal.SIGUSR1, step)
    signal.signal(signal.SIGUSR2, right)
    return run_scheduler(args, clock)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
