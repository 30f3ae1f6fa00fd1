"""The broker's log directory fills up (issue 8): errors surface, nothing acknowledged is lost,
and everything recovers once space is freed.

The broker of this scenario keeps its topic partitions on a small tmpfs (64 MiB in CI, 128 at
full size; the KRaft metadata log stays on the ordinary disk). With the roles running, a filler
file takes all but a few MiB of it, and jobs with 64 KiB payloads are created one by one until
the broker can no longer write (a full log directory takes a single-directory broker down).
Every create the SDK saw acknowledged is recorded. Then the filler is deleted and the broker
restarted on the same storage: every acknowledged job must run exactly once, new jobs must run,
the scheduler and workers must be running, and the failure must be visible in the broker's log
and in the roles' logs and error counters. We are root: the tmpfs is mounted here and unmounted
in a finalizer, even when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from duetime.core.errors import RetryableError
from duetime.infra.process import free_port
from tests.faults.harness import (
    FAULTS_HOME,
    FaultStack,
    Scenario,
    size,
    utc_ms,
    wait_for,
    write_figures,
)
from tests.faults.support import lateness_vs_schedule_ms

SIZES: dict[str, dict[str, Any]] = {
    # a 64 KiB payload is written about five times (definition, execution request, and the
    # state records that embed the definition): the headroom holds a few dozen such jobs
    "ci": {"tmpfs_mb": 64, "headroom_mb": 3, "payload_kb": 64, "after_jobs": 10},
    "full": {"tmpfs_mb": 128, "headroom_mb": 8, "payload_kb": 64, "after_jobs": 300},
}


@pytest.fixture
def tmpfs() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = FAULTS_HOME / f"tmpfs-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    mount.mkdir(parents=True, exist_ok=True)
    mb = SIZES[size()]["tmpfs_mb"]
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        with contextlib.suppress(OSError):
            mount.rmdir()


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def metric_total(port: int, name: str) -> float:
    """The sum of every sample of ``name`` on a role's /metrics (0 when absent)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


@pytest.mark.slow
def test_full_log_dir_loses_nothing_acknowledged_and_recovers(tmpfs: Path) -> None:
    sized = SIZES[size()]
    stack = FaultStack("disk-full", partition_dir=tmpfs)
    scenario: Scenario | None = None
    try:
        stack.start()
        scenario = stack.scenario("disk-full", 3, effects=True, terminal=True)
        ports = {"scheduler": free_port(), "worker": free_port()}
        scenario.start_role(
            "scheduler", "scheduler-1", DUETIME_METRICS_PORT=str(ports["scheduler"])
        )
        scenario.start_role("worker", "worker-1", DUETIME_METRICS_PORT=str(ports["worker"]))
        scenario.start_role("projector")
        scenario.schedulers_own_all(1)
        scenario.workers_assigned()
        payload = {"blob": "d" * (sized["payload_kb"] * 1024)}
        filler = tmpfs / "filler"
        acknowledged: list[str] = []
        refused = 0
        with scenario.job_client() as client:

            def create(name: str, payload: dict[str, Any] = payload) -> bool:
                at = datetime.now(UTC) + timedelta(seconds=1)
                try:
                    created = client.create_job(
                        name=name,
                        schedule={"at": at.isoformat()},
                        target={"type": "http", "url": scenario.sink.url},
                        payload=payload,
                        retry={"max_retries": 10, "base_delay_s": 1, "max_delay_s": 5},
                    )
                except RetryableError:
                    return False
                scenario.record_job(created, [utc_ms(at)])
                acknowledged.append(created.job_id)
                return True

            for i in range(5):  # the system works before the fault
                assert create(f"before-{i}")
            wait_for(lambda: scenario.sink.effects() >= 5, 60, "the first jobs to run")
            with scenario.fault("log-dir-full") as fault:
                spare = free_bytes(tmpfs) - sized["headroom_mb"] * 1024 * 1024
                with open(filler, "wb") as out:
                    out.write(b"\0" * max(0, spare))
                fault["filler_bytes"] = spare
                deadline = time.monotonic() + 300
                i = 0
                while stack.kafka.is_running() and time.monotonic() < deadline:
                    if not create(f"filling-{i}"):
                        refused += 1
                    i += 1
                assert not stack.kafka.is_running(), "the broker kept going on a full disk"
                broker_log = stack.kafka.server_log.read_text(errors="replace")
                fault["broker_says"] = [
                    line
                    for line in broker_log.splitlines()
                    if "No space left" in line or "offline" in line.lower()
                ][:3]
                filler.unlink()
                fault["broker_restart_s"] = stack.start_broker()
            for i in range(sized["after_jobs"]):
                # small ones: the space freed is for the backlog, not for refilling the disk
                assert create(f"after-{i}", {"i": i}), "a create failed after recovery"
        n = len(acknowledged)
        wait_for(
            lambda: scenario is not None and scenario.sink.effects() >= n,
            300,
            f"all {n} acknowledged jobs to run after the recovery",
            1.0,
        )
        alive = {r.name: r.running for r in scenario.roles.values()}
        errors = {
            name: metric_total(ports[role], name)
            for role, name in (
                ("scheduler", "duetime_scheduler_loop_errors_total"),
                ("scheduler", "duetime_transaction_aborts_total"),
                ("worker", "duetime_worker_loop_errors_total"),
            )
        }
        logs = {r.name: r.log() for r in scenario.roles.values()}
        report = scenario.finish()
        config = {
            **sized,
            "acknowledged": n,
            "refused_creates": refused,
            "roles_alive": alive,
            "role_error_metrics": errors,
            "max_lateness_vs_schedule_ms": lateness_vs_schedule_ms(scenario),
        }
        write_figures("disk-full", report, size(), config)
        print("figures:", report.figures(), "config:", config)
        assert report.ok, report.summary()
        # a create refused by timeout has an unknown outcome: it may have been written and run
        assert report.figures()["lost"] == 0 and n <= report.effects <= n + refused
        assert all(alive.values()), {k: logs[k][-2000:] for k, up in alive.items() if not up}
        assert any(b"No space left" in line.encode() for line in broker_log.splitlines()), (
            "the broker's log does not say the disk is full"
        )
        assert any(v > 0 for v in errors.values()) or any(
            "failed" in text for text in logs.values()
        ), "the roles did not report the outage"
    finally:
        if scenario is not None:
            scenario.close()
        stack.close()
