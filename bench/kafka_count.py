"""What a run cost Kafka, counted on the broker's own logs (issue 15: the broker's CPU per job).

:func:`snapshot` takes every partition's end offset of the run's topics and of the broker's
internal ``__transaction_state`` and ``__consumer_offsets`` (each a log the broker writes and
fsyncs); :func:`count` then reads what was written between two snapshots with a
``read_uncommitted`` consumer, which is handed every data record but never a transaction's
control record. So, per topic: ``offsets`` advanced, ``records`` written (data) and
``markers`` = offsets − records (one commit or abort marker per partition per transaction that
wrote to it: the transaction's cost on that log). Divided by the jobs of the run it gives the
records per job per topic the README's table shows.

The internal topics are the broker's, shared by every client: counted on a broker that only
this run uses (``DUETIME_KAFKA_BOOTSTRAP``) they are the run's; on the shared bench broker a
concurrent run's work would be counted too (the result says which broker it was).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from duetime.core.kafka import watermarks

INTERNAL = ("__transaction_state", "__consumer_offsets")
"""The broker's own logs a transaction and an offset commit write to."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """End offsets of every partition of the counted topics at one moment."""

    ends: dict[tuple[str, int], int]
    taken_s: float


def _consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-count-{uuid.uuid4().hex[:8]}",  # never joins: assign only
            "enable.auto.commit": False,
            # every data record, aborted or not (a control record is never handed out)
            "isolation.level": "read_uncommitted",
            "enable.partition.eof": True,
            "log_level": 3,
        }
    )


def snapshot(bootstrap: str, prefix: str) -> Snapshot:
    """End offsets of the topics under ``prefix`` and of the internal topics."""
    consumer = _consumer(bootstrap)
    try:
        md = consumer.list_topics(timeout=30)
        ends: dict[tuple[str, int], int] = {}
        for name, topic in md.topics.items():
            if not (name.startswith(prefix) or name in INTERNAL):
                continue
            for p in topic.partitions:
                # retried while the cluster settles (a fresh topic's leader not known yet)
                ends[(name, p)] = watermarks(consumer, name, p)[1]
        return Snapshot(ends, time.time())
    finally:
        consumer.close()


def count(
    bootstrap: str,
    prefix: str,
    before: Snapshot,
    after: Snapshot,
    jobs: int,
    timeout_s: float = 120,
) -> dict[str, Any]:
    """Per topic (the prefix cut off): offsets advanced, data records, markers, and each per job;
    plus ``transactions_est``: markers on the execution and state topics do not say how many
    transactions there were, ``__transaction_state`` does (about 3 records per transaction:
    ongoing, prepare, complete)."""
    todo = {tp: (start, after.ends[tp]) for tp, start in before.ends.items() if tp in after.ends}
    records = _read(bootstrap, {tp: span for tp, span in todo.items() if span[1] > span[0]},
                    timeout_s)  # fmt: skip
    per_topic: dict[str, dict[str, Any]] = {}
    for (topic, _), (start, end) in todo.items():
        name = topic[len(prefix) :] if topic.startswith(prefix) else topic
        row = per_topic.setdefault(name, {"offsets": 0, "records": 0})
        row["offsets"] += end - start
    for (topic, _), n in records.items():
        name = topic[len(prefix) :] if topic.startswith(prefix) else topic
        per_topic[name]["records"] += n
    for row in per_topic.values():
        row["markers"] = row["offsets"] - row["records"]
        for what in ("offsets", "records", "markers"):
            row[f"{what}_per_job"] = round(row[what] / jobs, 3) if jobs else None
    window_s = max(1e-9, after.taken_s - before.taken_s)
    txn_records = per_topic.get("__transaction_state", {}).get("records", 0)
    return {
        "jobs": jobs,
        "window_s": round(window_s, 1),
        "window_unix_s": [round(before.taken_s, 1), round(after.taken_s, 1)],
        "topics": {k: per_topic[k] for k in sorted(per_topic) if per_topic[k]["offsets"]},
        "transactions_est": round(txn_records / 3),
        "transactions_est_per_s": round(txn_records / 3 / window_s, 1),
    }


def _read(
    bootstrap: str, spans: dict[tuple[str, int], tuple[int, int]], timeout_s: float
) -> dict[tuple[str, int], int]:
    """Data records per partition in [start, end) of each span."""
    counted = dict.fromkeys(spans, 0)
    if not spans:
        return counted
    consumer = _consumer(bootstrap)
    try:
        consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in spans.items()])
        open_tps = set(spans)
        deadline = time.monotonic() + timeout_s
        while open_tps and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 1.0):
                tp = (msg.topic(), msg.partition())
                if tp not in open_tps:
                    continue
                if msg.error() is not None:  # partition EOF: nothing more was written
                    open_tps.discard(tp)
                    continue
                offset = msg.offset()
                if offset is not None and offset < spans[tp][1]:
                    counted[tp] += 1
                if offset is not None and offset + 1 >= spans[tp][1]:
                    open_tps.discard(tp)
        return counted
    finally:
        consumer.close()
