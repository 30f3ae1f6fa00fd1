"""Back-to-back Kafka transactions by the producer's ``retry.backoff.ms`` (issue 15).

    ./run bench txn                       # -> bench/results/txn-backoff.json
    ./run bench txn --backoffs 100 10 --transactions 300 --rounds 2

One transactional producer on the bench stack's broker runs what a scheduler partition's
commit does, over and over: begin, one record to an execution topic, ``send_offsets_to_
transaction`` for an input partition, commit. A transaction begun right after the previous
commit is answered CONCURRENT_TRANSACTIONS until the coordinator has written that commit's
markers, and librdkafka retries it after ``retry.backoff.ms`` (100 ms by default): the cycle
then takes the backoff, whatever the broker's speed. The backoffs run in turns (each once per
round) so that a busy box favours none; the scheduler's transactional producers use the
lower one (``duetime.core.kafka.TXN_RETRY_BACKOFF_MS``).
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.common import bench_stack, percentiles, probe_result, progress, write_result
from bench.cpu import CpuMeter, pid_listening
from bench.worker_throughput import PARTITIONS, fresh
from duetime.core.topics import Topics


def cycles_ms(common: Any, backoff_ms: int, transactions: int) -> list[float]:
    """Per transaction: ms from ``begin_transaction`` to ``commit_transaction``'s return."""
    topics = Topics(common.topic_prefix)
    group = Consumer(
        {"bootstrap.servers": common.bootstrap_servers, "group.id": f"txn-{uuid.uuid4().hex[:8]}"}
    )
    producer = Producer(
        {
            "bootstrap.servers": common.bootstrap_servers,
            "transactional.id": f"txn-backoff-{uuid.uuid4().hex[:8]}",
            "linger.ms": 0,
            "retry.backoff.ms": backoff_ms,
            "log_level": 3,
        }
    )
    producer.init_transactions(30)
    out: list[float] = []
    try:
        for i in range(transactions):
            start = time.monotonic()
            producer.begin_transaction()
            producer.produce(topics.execution("normal"), value=b"x" * 250, partition=0)
            producer.send_offsets_to_transaction(
                [TopicPartition(topics.jobs, 0, i + 1)], group.consumer_group_metadata(), 30
            )
            producer.commit_transaction(30)
            out.append((time.monotonic() - start) * 1000)
    finally:
        producer.flush(5)
        group.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run bench txn", description=__doc__)
    parser.add_argument("--backoffs", type=int, nargs="+", default=[100, 10])
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    cycles: dict[int, list[float]] = {b: [] for b in args.backoffs}
    broker_cpu_s: dict[int, float] = {b: 0.0 for b in args.backoffs}
    with bench_stack(PARTITIONS) as base, fresh(base) as common:
        kafka_pid = pid_listening(int(common.bootstrap_servers.rsplit(":", 1)[1]))
        for round_no in range(args.rounds):
            for backoff in args.backoffs:
                meter = CpuMeter({"kafka": kafka_pid})
                meter.start()
                got = cycles_ms(common, backoff, args.transactions)
                meter.stop()
                cycles[backoff] += got
                broker_cpu_s[backoff] += meter.seconds().get("kafka") or 0.0
                progress(f"round {round_no + 1}, retry.backoff.ms {backoff}: {percentiles(got)}")
    total = args.rounds * args.transactions
    result = probe_result(
        "txn-backoff",
        cycle_ms={str(b): percentiles(v) for b, v in cycles.items()},
        transactions_per_s={str(b): round(len(v) / (sum(v) / 1000), 1) for b, v in cycles.items()},
        broker_cpu_ms_per_transaction={
            str(b): round(s / total * 1000, 2) for b, s in broker_cpu_s.items()
        },
        config={
            "backoffs_ms": args.backoffs,
            "transactions": args.transactions,
            "rounds": args.rounds,
            "measured": "begin -> one record -> send_offsets_to_transaction -> commit, back to "
            "back, one producer; broker CPU over each turn / its transactions",
            "command": "./run bench txn " + " ".join(argv or []),
        },
    )
    write_result("txn-backoff", result)
    return 0
