"""CPU seconds of the processes a benchmark runs, from /proc (Linux), for "CPU per job".

A process's CPU here is its own user + system time, that of its live descendants, and what
its reaped children used (``cutime``/``cstime``): so a PostgreSQL postmaster counts its
backends, a uvicorn or Celery parent its workers, even those that exited during the run.

``CpuMeter`` reads each named process tree at ``start()`` and ``stop()``; with
``interval_s`` it also samples them in a thread in between, so that the CPU of any span
inside can be read afterwards (``window(start, end)``, linear between samples). That is how
every benchmark reports a span with the same edges for every system: from just before the first
job is created to the last start (or arrival), which is known only once the run is over. Beside the
window, ``lifetime()`` keeps each process's CPU from its own start to the end of the run, so
start-up and idle costs (a fresh broker's JVM start and JIT: 8-9 CPU-seconds) stay visible
without being charged to the jobs. A process that is gone (or unreadable) is reported as
``None`` rather than guessed.

The meter also reads the whole machine (``/proc/stat``): over a window, ``host_cpu`` says
how much of the cores' time was busy, and how much the hypervisor gave to other guests
(steal). The same code has measured 3.0 and 5.9 ms of CPU a job minutes apart on these
shared virtual machines; a window with steal says the box, not the code, slowed.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


def host_cpu_s() -> tuple[float, float, float] | None:
    """The machine's cumulative (busy, steal, all) CPU seconds over every core since boot,
    from ``/proc/stat``'s first line; busy is user + nice + system + irq + softirq (guest
    time is inside user), all adds idle, iowait and steal. None where there is no /proc."""
    try:
        with open("/proc/stat") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    busy = user + nice + system + irq + softirq
    return busy / _TICKS, steal / _TICKS, (busy + idle + iowait + steal) / _TICKS


def pid_listening(port: int) -> int | None:
    """The pid of the process with a TCP socket listening on ``port`` (any address)."""
    return listener_pid(port)


SAMPLE_S = 0.5
"""How often a benchmark's meter reads every process's CPU (a reading of a broker, a
database and six roles costs the bench ~5 ms): a window's edges are interpolated between
readings, so its error is a fraction of one interval's CPU."""


class Timeline:
    """Cumulative CPU readings of one process tree: (unix seconds, CPU seconds), in order."""

    def __init__(self) -> None:
        self.times_s: list[float] = []
        self.cpu_s: list[float] = []

    def record(self, at_s: float, cpu_s: float) -> None:
        # /proc's ticks never go back; a reading that seems to (a reaped child's time moving
        # to the parent between two reads of the tree) is held at the previous one
        if self.cpu_s and cpu_s < self.cpu_s[-1]:
            cpu_s = self.cpu_s[-1]
        if self.times_s and at_s <= self.times_s[-1]:
            self.cpu_s[-1] = cpu_s
            return
        self.times_s.append(at_s)
        self.cpu_s.append(cpu_s)

    def at(self, at_s: float) -> float | None:
        """The cumulative CPU at ``at_s``: linear between the readings around it, held at
        the first or last reading outside them; None without readings."""
        if not self.times_s:
            return None
        i = bisect.bisect_left(self.times_s, at_s)
        if i == 0:
            return self.cpu_s[0]
        if i == len(self.times_s):
            return self.cpu_s[-1]
        t0, t1 = self.times_s[i - 1], self.times_s[i]
        c0, c1 = self.cpu_s[i - 1], self.cpu_s[i]
        # clamped: the rounding of the interpolation must not step outside its two readings
        return min(c1, max(c0, c0 + (c1 - c0) * (at_s - t0) / (t1 - t0)))


class CpuMeter:
    """CPU seconds per named process tree over a window: ``start()`` … ``stop()``, then
    ``seconds()`` for that window, ``window(a, b)`` for a span inside it (with
    ``interval_s``: sampled in between) and ``lifetime()`` for each process's whole life."""

    def __init__(self, pids: Mapping[str, int | None], interval_s: float | None = None) -> None:
        self.pids = dict(pids)
        self.interval_s = interval_s
        self.timelines: dict[str, Timeline] = {name: Timeline() for name in self.pids}
        self.started_s: float | None = None
        self.stopped_s: float | None = None
        self.last: dict[str, float | None] = {}
        self.peak_rss_bytes: dict[str, int] = {}
        """Each process's largest RSS over the readings (the root process, not its tree)."""
        self.host = {"busy": Timeline(), "steal": Timeline(), "all": Timeline()}
        """The whole machine's cumulative CPU seconds (``host_cpu_s``), read with the processes."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, name: str, pid: int | None) -> None:
        """A process that starts inside the window: it is measured from zero at this call."""
        with self._lock:
            self.pids[name] = pid
            self.timelines[name] = Timeline()
            self.timelines[name].record(time.time(), 0.0)

    def start(self) -> None:
        self.started_s = self._sample()
        if self.interval_s is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self.stopped_s = self._sample()

    def _run(self) -> None:
        assert self.interval_s is not None
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> float:
        with self._lock:
            pids = dict(self.pids)
        readings = {name: _read(pid) for name, pid in pids.items()}
        rss = {name: _rss(pid) for name, pid in pids.items()}
        host = host_cpu_s()
        now = time.time()
        with self._lock:
            if host is not None:
                for line, value in zip(self.host.values(), host, strict=True):
                    line.record(now, value)
            for name, size in rss.items():
                if size is not None:
                    self.peak_rss_bytes[name] = max(self.peak_rss_bytes.get(name, 0), size)
            for name, cpu in readings.items():
                self.last[name] = cpu
                if cpu is not None:
                    self.timelines[name].record(now, cpu)
        return now

    def seconds(self) -> dict[str, float | None]:
        """CPU seconds per process from ``start()`` to ``stop()``; None for a process that
        was gone at ``stop()``."""
        if self.started_s is None or self.stopped_s is None:
            return {name: None for name in self.pids}
        out = self.window(self.started_s, self.stopped_s)
        return {n: None if self.last.get(n) is None else s for n, s in out.items()}

    def window(self, start_s: float, end_s: float) -> dict[str, float | None]:
        """CPU seconds per process between two unix times (inside ``start()`` … ``stop()``:
        an edge outside is held at the first or last reading)."""
        out: dict[str, float | None] = {}
        for name, line in self.timelines.items():
            a, b = line.at(start_s), line.at(end_s)
            out[name] = None if a is None or b is None else round(max(0.0, b - a), 2)
        return out

    def host_window(self, start_s: float, end_s: float) -> dict[str, float | None]:
        """The machine over a window: its cores' time (``core_s``: cores × seconds), the busy
        and stolen seconds in it, their shares, and ``unmetered_s``: busy seconds no metered
        process spent (the bench itself, other work on the box). Nones without /proc."""
        got = {}
        for key, line in self.host.items():
            a, b = line.at(start_s), line.at(end_s)
            got[key] = None if a is None or b is None else max(0.0, b - a)
        busy, steal, core = got["busy"], got["steal"], got["all"]
        if busy is None or steal is None or not core:
            return dict.fromkeys(
                ("core_s", "busy_s", "steal_s", "busy_share", "steal_share", "unmetered_s")
            )
        metered = sum(v for v in self.window(start_s, end_s).values() if v is not None)
        return {
            "core_s": round(core, 2),
            "busy_s": round(busy, 2),
            "steal_s": round(steal, 2),
            "busy_share": round(busy / core, 3),
            "steal_share": round(steal / core, 3),
            "unmetered_s": round(max(0.0, busy - metered), 2),
        }

    def lifetime(self) -> dict[str, float | None]:
        """Each process's CPU seconds from its own start to ``stop()`` (start-up and idle
        included); None for a process that was gone at ``stop()``."""
        return {n: None if c is None else round(c, 2) for n, c in self.last.items()}


def _read(pid: int | None) -> float | None:
    return None if pid is None else tree_cpu_s(pid)


def rss_bytes(pid: int) -> int:
    """The process's resident set size now (0 if /proc says none)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _rss(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return rss_bytes(pid)
    except OSError:  # gone meanwhile: it keeps the peak it had
        return None


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


def window_figures(meter: CpuMeter, start_s: float, end_s: float) -> dict[str, Any]:
    """What a result records of ``meter``: ``cpu_s`` over [``start_s``, ``end_s``] (the
    figure per job is computed from), ``cpu_s_lifetime`` (each process from its own start to
    the meter's stop) and the window itself (unix seconds and its length)."""
    end_s = max(start_s, end_s)
    return {
        "cpu_s": meter.window(start_s, end_s),
        "cpu_s_lifetime": meter.lifetime(),
        "host_cpu": meter.host_window(start_s, end_s),
        "cpu_window": {
            "start_unix_s": round(start_s, 3),
            "end_unix_s": round(end_s, 3),
            "span_s": round(end_s - start_s, 2),
        },
    }
