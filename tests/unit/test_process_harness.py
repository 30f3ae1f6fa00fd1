"""The one SIGTERM → wait → SIGKILL (``infra.process.terminate``) and the shared harness's
role process, on real child processes (no broker or database needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from duetime.infra.harness import RoleProc, role_env, wait_for
from duetime.infra.process import kill_group, pid_alive, terminate

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
EXITS_3_ON_TERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )


def test_a_child_that_handles_sigterm_exits_cleanly_with_its_own_status() -> None:
    proc = child(EXITS_3_ON_TERM)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    started = time.monotonic()
    assert terminate(proc, 20, "clean child") == 3
    assert time.monotonic() - started < 10  # it never needed the SIGKILL


def test_a_child_that_ignores_sigterm_is_killed_after_the_deadline() -> None:
    proc = child(IGNORES_TERM)
    wait_for(lambda: _ignores_term(proc.pid), 10, "the child to install its handler")
    started = time.monotonic()
    assert terminate(proc, 0.5, "stubborn child") == -signal.SIGKILL
    assert time.monotonic() - started >= 0.5


def test_a_paused_child_is_continued_so_it_can_act_on_sigterm() -> None:
    proc = child(EXITS_3_ON_TERM)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    os.killpg(proc.pid, signal.SIGSTOP)
    assert terminate(proc, 20, "paused child") == 3


def test_a_bare_pid_is_stopped_with_its_group_and_reaped() -> None:
    proc = child(IGNORES_TERM)
    wait_for(lambda: _ignores_term(proc.pid), 10, "the child to install its handler")
    assert terminate(proc.pid, 0.3, "server by pid", term_group=True) is None
    assert not pid_alive(proc.pid)


def test_ending_an_ended_process_is_a_no_op_that_reports_its_status() -> None:
    proc = child("raise SystemExit(5)")
    proc.wait(10)
    assert terminate(proc, 1, "gone") == 5
    assert kill_group(proc, "gone") == 5


def test_a_role_that_exits_while_awaited_fails_the_wait_at_once_with_its_log(
    tmp_path: Path,
) -> None:
    from duetime.core.config import CommonSettings, Env

    env = role_env(CommonSettings.from_env(Env({})))
    role = RoleProc.start("no-such-role", ["no-such-role"], env, log_path=tmp_path / "r.log")
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"no-such-role exited \(2\)") as failure:
        role.wait_log("never printed", timeout_s=60)
    assert time.monotonic() - started < 30
    assert "invalid choice" in str(failure.value)  # the log's tail, argparse's complaint


def test_a_restarted_role_appends_to_its_log_and_reads_its_current_run_apart(
    tmp_path: Path,
) -> None:
    from duetime.core.config import CommonSettings, Env

    env = role_env(CommonSettings.from_env(Env({})))
    role = RoleProc("twice", ["--help"], env, log_path=tmp_path / "twice.log")
    role.spawn()
    assert role.process.wait(60) == 0
    first = role.log()
    role.spawn()
    assert role.process.wait(60) == 0
    assert role.starts == 2
    assert role.log().startswith(first)  # appended, never truncated
    assert role.log_count("--- harness: start #") == 2
    assert "--- harness: start #" not in role.log_since_start()
    assert "usage" in role.log_since_start()
    assert role.env["DUETIME_INSTANCE_ID"] == "twice"


def test_a_role_never_started_says_so() -> None:
    role = RoleProc("idle", ["scheduler"], {})
    assert role.pid is None and not role.running and role.stop() is None
    with pytest.raises(RuntimeError, match="idle was never started"):
        _ = role.process


def _ignores_term(pid: int) -> bool:
    """The kernel's mask of ignored signals shows SIGTERM (the handler is in place)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    ignored = next(line for line in status.splitlines() if line.startswith("SigIgn:"))
    return bool(int(ignored.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
