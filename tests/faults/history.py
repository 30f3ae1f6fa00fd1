"""The fault campaign's history: one JSON object per line, appended by every observer.

Kinds of event (each has ``kind`` and ``t_ms``, the wall-clock time it was recorded):

- ``config``: the scenario's name and what the checker should expect (``effects``: workers
  call the sink, so every expected occurrence must have an effect; ``terminal``: executions
  must end in a terminal status);
- ``job``: a job created by the scenario: ``job_id``, ``name``, ``expect_ms`` (the occurrences,
  ms since the epoch, that must run; null: not checked), ``exact`` (also no other occurrence may
  run), ``misfire``, ``overlap``;
- ``request``: an execution request seen by the read_committed recorder: ``topic``,
  ``partition``, ``offset`` and the record's ``execution_id``, ``job_id``, ``attempt``,
  ``scheduled_at_ms``, ``due_at_ms``, ``emitted_at_ms``, ``trigger``;
- ``result``: an execution result seen by the recorder (``status``, ``worker_id``, ...);
- ``delivery``: a request at the HTTP sink: ``key`` (the Idempotency-Key, "" when missing),
  ``job_id``, ``attempt``, ``scheduled_at_ms``, ``status`` (what the sink answered), ``at_ms``;
- ``fault``: an injected fault: ``name``, ``start_ms``, ``end_ms``;
- ``audit``: what the final audit found: ``aborted`` (topic/partition/offset of records of
  aborted transactions), ``uncommitted`` (offsets a read_uncommitted reader saw), ``lso``
  (per partition: last stable offset, high watermark, whether they met);
- ``status``: final projection rows from PostgreSQL: ``execution_id``, ``job_id``,
  ``scheduled_at_ms``, ``status``, ``attempt``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from duetime.core.clock import SYSTEM_CLOCK


def now_ms() -> int:
    """Wall-clock ms of the shared Clock (the roles' own time source)."""
    return SYSTEM_CLOCK.now_ms()


class History:
    """An append-only JSON-lines file, safe to write from several threads."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8")

    def add(self, kind: str, **fields: Any) -> None:
        fields["kind"] = kind
        fields.setdefault("t_ms", now_ms())
        line = json.dumps(fields, separators=(",", ":"), default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
        return load(self.path)


def load(path: Path) -> list[dict[str, Any]]:
    """Every event of a history file (a torn last line, from a killed writer, is skipped)."""
    out: list[dict[str, Any]] = []
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
