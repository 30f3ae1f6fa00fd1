"""Small things several of the fault scenarios share."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.infra.harness import reader
from tests.faults.harness import Scenario, size, write_figures


def lateness_vs_schedule_ms(scenario: Scenario) -> float:
    """Max of (first 2xx delivery - the time the job asked for). The checker measures from
    the request's ``due_at_ms``, which a misfired occurrence (fired late after a partition
    changed hands) resets to its emission: this one is what a user waiting for the job sees."""
    events = scenario.history.events()
    first: dict[str, int] = {}
    for e in events:
        if e["kind"] == "delivery" and 200 <= e["status"] < 300:
            first[e["job_id"]] = min(first.get(e["job_id"], e["at_ms"]), e["at_ms"])
    late = [
        first[e["job_id"]] - e["expect_ms"][0]
        for e in events
        if e["kind"] == "job" and e["expect_ms"] and e["job_id"] in first
    ]
    return float(max(late, default=0))


def write_counts(name: str, figures: dict[str, Any], config: dict[str, Any]) -> Path:
    """``bench/results/faults-<name>.json`` (``-ci`` at the CI size, as ``write_figures``) for a
    scenario judged without the history checker (poison, oversized): its own counts in the
    fields the reliability table reads."""
    counts = {"recovery_s": None, "max_lateness_ms": None, **figures}
    return write_figures(name, counts, size(), config)


@dataclass
class Parked:
    role: str
    topic: str
    partition: int
    offset: int
    value: bytes | None
    error: str


def parked(settings: CommonSettings) -> list[Parked]:
    """Everything in the poison topic now (read to its end)."""
    topics = Topics(settings.topic_prefix)
    c = reader(settings.bootstrap_servers, "poison-check", **{"enable.partition.eof": True})
    try:
        tps = [TopicPartition(topics.poison, p, 0) for p in range(settings.partitions)]
        c.assign(tps)
        ends = {p: c.get_watermark_offsets(tp, timeout=10)[1] for p, tp in enumerate(tps)}
        done: set[int] = {p for p, end in ends.items() if end == 0}
        out: list[Parked] = []
        deadline = time.monotonic() + 60
        while len(done) < len(tps):
            assert time.monotonic() < deadline, "reading the poison topic took over 60 s"
            for m in c.consume(500, 0.5):
                if m.error():
                    done.add(m.partition() or 0)
                    continue
                raw = m.headers() or []
                items = raw.items() if isinstance(raw, dict) else raw
                h = {
                    str(k): v.decode(errors="replace") if isinstance(v, bytes) else str(v or "")
                    for k, v in items
                }
                out.append(
                    Parked(
                        role=h.get("duetime-role", "?"),
                        topic=h.get("duetime-source-topic", "?"),
                        partition=int(h.get("duetime-source-partition", "-1")),
                        offset=int(h.get("duetime-source-offset", "-1")),
                        value=m.value(),
                        error=h.get("duetime-error", ""),
                    )
                )
        return out
    finally:
        c.close()
