"""CPU seconds of the processes a benchmark runs, from /proc (Linux), for "CPU per job".

A process's CPU here is its own user + system time, that of its live descendants, and what
its reaped children used (``cutime``/``cstime``): so a PostgreSQL postmaster counts its
backends, a uvicorn or Celery parent its workers, even those that exited during the run.
``CpuMeter`` takes a reading of each named process tree at the start and the end of the
measured window and reports the difference, per name and in total. A process that is gone at
the end (or unreadable) is reported as ``None`` rather than guessed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from duetime.infra.process import listener_pid

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name is in parentheses and may hold spaces: split after its last ')'
    return text[text.rfind(")") + 2 :].split()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text()
            out += [int(c) for c in text.split()]
    except OSError:
        pass
    return out


def tree_cpu_s(pid: int) -> float | None:
    """CPU seconds of ``pid``, its reaped children and its live descendants; None if gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    # after the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    total = sum(int(f) for f in fields[11:15]) / _TICKS
    for child in _children(pid):
        fields = _stat_fields(child)
        if fields is None:
            continue
        # a live child's own reaped children show in its cutime: recurse for its tree
        sub = tree_cpu_s(child)
        total += sub or 0.0
    return total


def pid_listening(port: int) -> int | None:
    """The pid of the process with a TCP socket listening on ``port`` (any address)."""
    return listener_pid(port)


class CpuMeter:
    """CPU seconds per named process tree over a window: ``start()`` … ``stop()``."""

    def __init__(self, pids: Mapping[str, int | None]) -> None:
        self.pids = dict(pids)
        self.before: dict[str, float | None] = {}
        self.after: dict[str, float | None] = {}

    def add(self, name: str, pid: int | None) -> None:
        """A process that starts inside the window: it is measured from zero."""
        self.pids[name] = pid
        self.before[name] = 0.0

    def start(self) -> None:
        self.before.update({n: _read(p) for n, p in self.pids.items() if n not in self.before})

    def stop(self) -> None:
        self.after = {n: _read(p) for n, p in self.pids.items()}

    def seconds(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for name in self.pids:
            b, a = self.before.get(name), self.after.get(name)
            out[name] = None if a is None or b is None else round(max(0.0, a - b), 2)
        return out


def _read(pid: int | None) -> float | None:
    return None if pid is None else tree_cpu_s(pid)


def per_job(
    cpu_s: Mapping[str, float | None], jobs: int, exclude: tuple[str, ...] = ()
) -> dict[str, float | None]:
    """Total CPU seconds of the named processes (except ``exclude``: the load generator and the
    sink, which are not the system under test) and that total in ms per completed job."""
    counted = {n: s for n, s in cpu_s.items() if n not in exclude}
    known = [s for s in counted.values() if s is not None]
    total = round(sum(known), 2) if known else None
    return {
        "system_cpu_s": total,
        "cpu_ms_per_job": None if total is None or jobs <= 0 else round(1000 * total / jobs, 3),
    }
