"""Roles as real processes for end-to-end tests: start, SIGKILL, SIGSTOP/SIGCONT, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from duetime.core.config import CommonSettings

LOG_DIR = Path(__file__).resolve().parents[2] / ".duetime" / "test-logs"


def role_env(settings: CommonSettings, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DUETIME_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
        "DUETIME_DATABASE_URL": settings.database_url,
        "DUETIME_TOPIC_PREFIX": settings.topic_prefix,
        "DUETIME_PARTITIONS": str(settings.partitions),
        "DUETIME_LOG_LEVEL": "INFO",
        # workers: the tests' HTTP sinks are on 127.0.0.1 and their tasks under tests.*
        "DUETIME_WORKER_EGRESS_ALLOW": "loopback",
        "DUETIME_WORKER_PYTHON_MODULES": "tests,bench",
    }
    env.update(extra)
    return env


@dataclass
class Role:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(cls, name: str, argv: list[str], env: dict[str, str]) -> Role:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log_path = LOG_DIR / f"{name}-{int(time.time() * 1000)}.log"
        with open(log_path, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "duetime.cli", *argv],
                env={**env, "DUETIME_INSTANCE_ID": name},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return cls(name, process, log_path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def pause(self) -> None:
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self, timeout_s: float = 20) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode
