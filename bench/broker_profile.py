"""Where the benchmark broker's CPU goes: its threads' CPU from /proc and a JFR profile.

Role: run beside a benchmark (which holds the bench lock) to see what the broker spends its
CPU on, by thread and by code:

    python -m bench.broker_profile watch --out /tmp/bp --jfr-s 60 &
    flock /work/notes/s21/bench.lock ./run bench worker rate --rate 350 --duration-s 30
    python -m bench.broker_profile report --out /tmp/bp --result bench/results/worker-rate-350.json

``watch`` waits for a broker to run in ``.duetime/bench`` with a duetime scheduler beside it
(the benchmark's roles are up), then reads the CPU of every broker thread from
``/proc/<pid>/task`` every second into ``threads.jsonl`` (until the broker exits) and records
``--jfr-s`` seconds of Java Flight Recorder (``jcmd JFR.start settings=profile``) into
``broker.jfr``. ``report`` sums the threads' CPU over the result's ``cpu_window`` (or the whole
watch) by thread group (request handlers, network processors, the log cleaner, GC, the JIT
compilers, ...) and the JFR execution samples by top frame and by package (``jfr print``).
Both are relative figures: nothing here is asserted, and the JVM's own threads that JFR does
not sample (GC, JIT) are seen only in the /proc figures.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import ROOT

PID_FILE = ROOT / ".duetime" / "bench" / "kafka.pid"
_TICKS_S = 100.0  # USER_HZ on Linux


def _broker_pid() -> int | None:
    try:
        pid = int(PID_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def _scheduler_running() -> bool:
    out = subprocess.run(["pgrep", "-f", "duetime.cli scheduler"], capture_output=True, text=True)
    return bool(out.stdout.strip())


def thread_names(pid: int) -> dict[str, str]:
    """Native thread id → full thread name, from ``jcmd Thread.print`` (/proc's ``comm``
    keeps 15 characters: "data-plane-kafk" is a request handler or a network thread)."""
    text = subprocess.run(["jcmd", str(pid), "Thread.print"], capture_output=True,
                          text=True).stdout  # fmt: skip
    return {
        str(int(m.group(2), 16)): m.group(1)
        for m in re.finditer(r'^"([^"]+)".*? nid=0x([0-9a-f]+)', text, re.M)
    }


def thread_cpu_s(pid: int) -> dict[str, tuple[str, float]]:
    """Native thread id → (``comm``, CPU seconds) of each thread of ``pid``."""
    out: dict[str, tuple[str, float]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return {}
    for task in tasks:
        try:
            text = (task / "stat").read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        out[task.name] = (name, (int(fields[11]) + int(fields[12])) / _TICKS_S)
    return out


def jit_cpu_s(pid: int) -> float:
    """CPU seconds of the JVM ``pid``'s JIT compiler threads (C1 and C2) so far."""
    return sum(cpu for name, cpu in thread_cpu_s(pid).values() if "CompilerThre" in name)


GROUPS: tuple[tuple[str, str], ...] = (
    (r"data-plane-kafka-request-handler|kafka-request-handler", "request handlers (broker)"),
    (r"controller-.*request-handler|quorum-controller|kafka-.*raft|raft", "KRaft controller"),
    (r"data-plane-kafka-network-thread|kafka-network-thread|data-plane-kafka-socket", "network"),
    (r"controller-.*network-thread|CONTROLLER", "controller network"),
    (r"kafka-log-cleaner", "log cleaner"),
    (r"^G1 |^GC Thread|^VM Periodic|^VM Thread", "GC and VM"),
    (r"^C[12] CompilerThre|^Sweeper", "JIT compilers"),
    (r"ExpirationReaper|executor-|group-coordinator|transaction-|TxnMarker", "coordinators"),
    (r"kafka-scheduler|log-|LogDirFailure|ReplicaFetcher|replica", "log manager and scheduler"),
    (r"JFR|jfr", "JFR itself"),
)


def group_of(thread: str) -> str:
    """The group a broker thread's name belongs to (its name, digits dropped, otherwise)."""
    for pattern, group in GROUPS:
        if re.search(pattern, thread):
            return group
    return re.sub(r"[-#]?\d+$", "", thread)


def watch(out: Path, jfr_s: float, timeout_s: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    pid = None
    while time.monotonic() < deadline:
        pid = _broker_pid()
        if pid is not None and _scheduler_running():
            break
        time.sleep(0.5)
    else:
        raise SystemExit(f"no benchmark broker with a scheduler within {timeout_s:.0f} s")
    assert pid is not None
    jfr = out / "broker.jfr"
    jfr.unlink(missing_ok=True)
    if jfr_s > 0:
        _start_jfr(pid, jfr, jfr_s)
    # the broker's threads are all up by now (its pools start with it)
    (out / "names.json").write_text(json.dumps(thread_names(pid)))
    with (out / "threads.jsonl").open("w") as f:
        while Path(f"/proc/{pid}").exists():
            f.write(json.dumps({"t": time.time(), "cpu": thread_cpu_s(pid)}) + "\n")
            f.flush()
            time.sleep(1.0)


def _start_jfr(pid: int, jfr: Path, jfr_s: float) -> None:
    subprocess.run(
        ["jcmd", str(pid), "JFR.start", f"duration={int(jfr_s)}s", f"filename={jfr}",
         "settings=profile", "name=duetime-bench"],
        check=True, capture_output=True,
    )  # fmt: skip
    print(f"JFR on broker pid {pid} for {jfr_s:.0f} s -> {jfr}", file=sys.stderr)


def _window(
    samples: list[dict[str, Any]], names: dict[str, str], start: float, end: float
) -> dict[str, float]:
    """CPU seconds per thread name between the first and last readings inside the window."""
    inside = [s for s in samples if start <= s["t"] <= end] or samples
    first, last = inside[0], inside[-1]
    print(f"threads: {last['t'] - first['t']:.0f} s of readings ({len(inside)})")
    # a thread's last reading in the window: the JVM ends idle compiler threads (dynamic
    # compiler threads), whose CPU would otherwise drop out of the sum
    latest: dict[str, tuple[str, float]] = {}
    for sample in inside:
        latest.update(sample["cpu"])
    used: dict[str, float] = {}
    for tid, (comm, cpu) in latest.items():
        before = first["cpu"].get(tid, (comm, 0.0))[1]
        name = names.get(tid, comm)
        used[name] = used.get(name, 0.0) + cpu - before
    return used


def report(out: Path, result: Path | None, top: int) -> None:
    samples = [json.loads(line) for line in (out / "threads.jsonl").read_text().splitlines()]
    start, end = 0.0, float("inf")
    if result is not None:
        window = json.loads(result.read_text()).get("cpu_window") or {}
        start, end = window.get("start_unix_s", 0.0), window.get("end_unix_s", float("inf"))
    names_file = out / "names.json"
    names = json.loads(names_file.read_text()) if names_file.exists() else {}
    used = _window(samples, names, start, end)
    groups: dict[str, float] = {}
    for thread, cpu in used.items():
        groups[group_of(thread)] = groups.get(group_of(thread), 0.0) + cpu
    total = sum(groups.values()) or 1.0
    print(f"broker CPU by thread group, {total:.1f} s:")
    for group, cpu in sorted(groups.items(), key=lambda kv: -kv[1]):
        if cpu >= 0.05:
            print(f"  {cpu:7.2f} s {100 * cpu / total:5.1f} %  {group}")
    jfr = out / "broker.jfr"
    if jfr.exists():
        _jfr_report(jfr, top)


def _jfr_report(jfr: Path, top: int) -> None:
    text = subprocess.run(
        ["jfr", "print", "--events", "jdk.ExecutionSample", "--stack-depth", "64", str(jfr)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    frames: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for event in text.split("jdk.ExecutionSample")[1:]:
        m = re.search(r'sampledThread = "([^"]+)"', event)
        threads[group_of(m.group(1)) if m else "?"] += 1
        stack = re.findall(r"^\s+([\w$.<>/]+)\(", event, re.M)
        if not stack:
            continue
        frames[stack[0]] += 1
        packages[_package(stack[0])] += 1
        for method in set(stack):
            if method.startswith(("kafka.", "org.apache.kafka.")):
                inclusive[method] += 1
    n = sum(frames.values()) or 1
    print(f"JFR execution samples: {n}")
    tables = (
        ("thread group", threads),
        ("top frame's package", packages),
        ("top frame", frames),
        ("Kafka method, inclusive", inclusive),
    )
    for title, counts in tables:
        print(f"by {title}:")
        for key, count in counts.most_common(top):
            print(f"  {100 * count / n:5.1f} %  {key}")


def _package(method: str) -> str:
    parts = method.split(".")
    return ".".join(parts[: min(len(parts) - 2, 4)]) if len(parts) > 2 else method


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.broker_profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("watch", help="profile the next benchmark's broker")
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--jfr-s", type=float, default=60.0, help="0: threads only, no JFR")
    w.add_argument("--timeout-s", type=float, default=1800.0)
    r = sub.add_parser("report", help="summarize a watch")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--result", type=Path, default=None, help="a result JSON: its cpu_window")
    r.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    if args.command == "watch":
        watch(args.out, args.jfr_s, args.timeout_s)
    else:
        report(args.out, args.result, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
