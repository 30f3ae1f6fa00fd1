"""Process and port helpers shared by the local Kafka and PostgreSQL launchers.

Role: the small, dependency-free pieces that make starting a local server robust: bounded
waits, pid files, port ownership checks and log tails.

Guarantees:
- ``wait_until`` never waits past its deadline; its error names what it waited for.
- ``port_holder`` answers from /proc (no root-only tools needed) and degrades to ``ss``;
  it never raises for a missing tool.
- ``terminate`` (and ``stop_process_group``, its form for servers) sends SIGTERM, waits up to
  the deadline, then SIGKILLs the whole process group, and only ever signals the process id it
  was given (and its group).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("duetime.infra")


class InfraError(RuntimeError):
    """A local server could not be prepared, started, reused or stopped."""


def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    interval_s: float = 0.2,
    abort: Callable[[], str | None] | None = None,
) -> float:
    """Poll ``predicate`` until it is true; return the seconds waited.

    ``abort`` is checked on every round; a non-None string ends the wait at once with that
    reason (used to notice that the server process died). Raises ``TimeoutError`` naming
    ``what`` when the deadline passes.
    """
    start = time.monotonic()
    deadline = start + timeout_s
    while True:
        if predicate():
            return time.monotonic() - start
        if abort is not None:
            reason = abort()
            if reason is not None:
                raise InfraError(f"gave up waiting for {what}: {reason}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def port_open(port: int, host: str = "127.0.0.1", timeout_s: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes of TCP listeners (state 0A) on ``port``, any address, v4 and v6."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def listener_pid(port: int) -> int | None:
    """The pid of the process listening on TCP ``port`` (any address), when /proc shows it
    (root, or our own processes)."""
    targets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not targets:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in targets:
                        return int(proc.name)
        except OSError:
            continue
    return None


def port_holder(port: int) -> str | None:
    """Describe who listens on ``port`` ("pid 123 (java: ...)"), or None when nobody does.

    Reads /proc/net/tcp{,6} and the /proc/<pid>/fd links; when the owning process cannot be
    found (another user's process without root) it falls back to ``ss -ltnp``.
    """
    if not _listening_inodes(port):
        return None
    pid = listener_pid(port)
    if pid is not None:
        return f"pid {pid} ({describe_pid(pid)})"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        if out:
            return out
    return "an unknown process"


def ensure_port_free(port: int, what: str, grace_s: float = 0.0) -> None:
    """Raise ``InfraError`` naming the holder when something listens on 127.0.0.1:``port``.

    ``grace_s`` gives a process that was just killed time to release its sockets: a
    multi-threaded process (a JVM) shows as a zombie before its threads have closed them.
    """
    deadline = time.monotonic() + grace_s
    while True:
        holder = port_holder(port)
        if holder is None and not port_open(port):
            return
        if time.monotonic() >= deadline:
            raise InfraError(
                f"cannot start {what}: port 127.0.0.1:{port} is already in use by "
                f"{holder or 'an unknown process'}"
            )
        time.sleep(0.2)


def describe_pid(pid: int) -> str:
    """A short "name: command line" of a process, for error messages."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "gone"
    cmd = cmd.strip()
    if len(cmd) > 160:
        cmd = cmd[:160] + "…"
    return f"{name}: {cmd}"


def pid_alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state is the first field after the parenthesised command name.
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def process_name(pid: int) -> str:
    """The kernel's short name of the process (``comm``), or "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def read_pid_file(path: Path) -> int | None:
    """The pid in ``path``, or None when the file is missing or unreadable."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def write_pid_file(path: Path, pid: int) -> None:
    """Write ``pid`` atomically (temp file + rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(f"{pid}\n")
    tmp.replace(path)


def reap(pid: int) -> None:
    """Collect the exit status of our own child ``pid`` if it has ended (no-op otherwise)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop_process_group(pid: int, timeout_s: float, what: str) -> None:
    """SIGTERM the process group led by ``pid``; SIGKILL it after ``timeout_s``.

    The process must have been started with ``start_new_session=True`` so that its group
    holds only it and its children.
    """
    terminate(pid, timeout_s, what, term_group=True)


def terminate(
    target: int | subprocess.Popen[Any],
    timeout_s: float,
    what: str,
    *,
    term_group: bool = False,
    kill_wait_s: float = 10,
) -> int | None:
    """SIGTERM → wait up to ``timeout_s`` → SIGKILL the process group: the one way a process
    we started is stopped (local servers, roles in tests, benchmarks and ``duetime dev``).

    ``target`` is our ``Popen`` child (its exit status is collected and returned) or a bare
    pid (a server found by its pid file; returns None). SIGTERM goes to the process alone
    unless ``term_group``: a role's own handler shuts its children down in order, whereas a
    server's launcher script wants the whole group told. A stopped (SIGSTOP) group is
    continued first, or it could never act on the SIGTERM. SIGKILL always goes to the whole
    group (the target must lead its own session, ``start_new_session=True``). Raises
    ``InfraError`` when the process outlives SIGKILL by ``kill_wait_s``.
    """
    pid = target if isinstance(target, int) else target.pid
    if _gone(target, 0):
        return _status(target)
    log.info("stopping %s (pid %d)", what, pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGCONT)
    with contextlib.suppress(ProcessLookupError):
        if term_group:
            os.killpg(pid, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGTERM)
    if _gone(target, timeout_s):
        return _status(target)
    log.warning("%s (pid %d) ignored SIGTERM for %.0f s; sending SIGKILL", what, pid, timeout_s)
    return kill_group(target, what, kill_wait_s)


def kill_group(target: int | subprocess.Popen[Any], what: str, wait_s: float = 10) -> int | None:
    """SIGKILL the process group led by ``target`` (after a SIGCONT, so a paused group dies
    too) and wait until its leader is gone; its exit status when ``target`` is our child."""
    pid = target if isinstance(target, int) else target.pid
    if _gone(target, 0):
        return _status(target)
    for sig in (signal.SIGCONT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
    if not _gone(target, wait_s):
        raise InfraError(f"{what} (pid {pid}) survived SIGKILL")
    return _status(target)


def _gone(target: int | subprocess.Popen[Any], timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for ``target`` to end (reaping it when it is our child)."""
    if not isinstance(target, int):
        try:
            target.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = time.monotonic() + timeout_s
    while True:
        reap(target)
        if not pid_alive(target):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _status(target: int | subprocess.Popen[Any]) -> int | None:
    return None if isinstance(target, int) else target.returncode


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a text file, or a note that it is missing."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode(errors="replace")
    except OSError as exc:
        return f"(no log at {path}: {exc.strerror})"
    return "\n".join(data.splitlines()[-lines:])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
