"""What a consumer's ``fetch.wait.max.ms`` costs and buys with read_committed (issue 15).

    ./run bench fetch                      # -> bench/results/fetch-wait.json
    ./run bench fetch --waits 10 100 500 --commits 30

Two measurements on the bench stack (a local broker, 12 partitions per topic):

- *wake*: a read_committed consumer of one execution topic sits in an idle fetch; a
  transactional producer commits one record 0.7-1.1 s later. Per commit: the time from
  ``commit_transaction`` returning to the record's arrival. If the broker did not answer a
  parked fetch when the commit marker lands, this would grow with the wait (up to it).
- *idle cost*: the broker's CPU per second while one consumer of the results and execution
  topics (60 partitions) fetches with nothing to read, against the broker alone.

The waits run in turns (each wait once per round, ``--rounds`` rounds), so that a busy box
does not favour whichever runs last. The workers fetch with the wait this justifies
(``consumers/worker/service.py``).
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

from bench.common import bench_stack, percentiles, probe_result, progress, write_result
from bench.cpu import CpuMeter, pid_listening
from bench.worker_throughput import PARTITIONS, fresh
from duetime.core.topics import Topics
from duetime.infra.harness import assign_all, reader


def wake_ms(common: Any, wait_ms: int, commits: int) -> list[float]:
    """Per committed record: ms from the commit's return to its arrival at an idle reader."""
    topic = Topics(common.topic_prefix).execution("normal")
    consumer = Consumer(
        {
            "bootstrap.servers": common.bootstrap_servers,
            "group.id": f"fetch-wait-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": wait_ms,
            "log_level": 3,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(PARTITIONS)])
    producer = Producer(
        {
            "bootstrap.servers": common.bootstrap_servers,
            "transactional.id": f"fetch-wait-{uuid.uuid4().hex[:8]}",
            "linger.ms": 1,
        }
    )
    producer.init_transactions(30)
    arrived: dict[bytes, float] = {}
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            for m in consumer.consume(100, 0.05):
                if m.error() is None and m.value() is not None:
                    arrived[m.value() or b""] = time.monotonic()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    out: list[float] = []
    try:
        stop.wait(3.0)  # assigned and parked
        for i in range(commits):
            stop.wait(0.7 + 0.4 * (i % 5) / 4)  # into the idle wait, at varying points
            value = f"{wait_ms}/{i}".encode()
            producer.begin_transaction()
            producer.produce(topic, value, partition=i % PARTITIONS)
            producer.commit_transaction(10)
            committed = time.monotonic()
            deadline = committed + 5.0
            while value not in arrived and time.monotonic() < deadline:
                time.sleep(0.001)
            if value in arrived:
                out.append(round(1000 * (arrived[value] - committed), 1))
    finally:
        stop.set()
        thread.join(5)
        consumer.close()
    return out


def idle_broker_cpu(
    common: Any, kafka_pid: int | None, wait_ms: int | None, seconds: float
) -> float:
    """Broker CPU seconds per second with one idle fetcher (None: no consumer at all)."""
    topics = Topics(common.topic_prefix)
    consumer = None
    stop = threading.Event()
    thread = None
    if wait_ms is not None:
        consumer = reader(common.bootstrap_servers, "fetch-idle", **{"fetch.wait.max.ms": wait_ms})
        assign_all(consumer, (topics.results, *topics.executions))
        idle = consumer

        def poll() -> None:
            while not stop.is_set():
                idle.consume(500, 0.05)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        stop.wait(2.0)
    meter = CpuMeter({"kafka": kafka_pid})
    meter.start()
    stop.wait(seconds)
    meter.stop()
    stop.set()
    if thread is not None:
        thread.join(5)
    if consumer is not None:
        consumer.close()
    used = meter.seconds()["kafka"]
    return round((used or 0.0) / seconds, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run bench fetch", description=__doc__)
    parser.add_argument("--waits", type=int, nargs="+", default=[10, 500])
    parser.add_argument("--commits", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=10.0)
    args = parser.parse_args(argv)
    wake: dict[int, list[float]] = {w: [] for w in args.waits}
    idle: dict[str, list[float]] = {}
    with bench_stack(PARTITIONS) as base, fresh(base) as common:
        kafka_pid = pid_listening(int(common.bootstrap_servers.rsplit(":", 1)[1]))
        for round_no in range(args.rounds):
            for wait in args.waits:
                got = wake_ms(common, wait, args.commits)
                wake[wait] += got
                progress(f"round {round_no + 1}, wait {wait} ms: after commit {percentiles(got)}")
            for wait_or_none in (None, *args.waits):
                label = "no consumer" if wait_or_none is None else f"{wait_or_none} ms"
                cost = idle_broker_cpu(common, kafka_pid, wait_or_none, args.idle_s)
                idle.setdefault(label, []).append(cost)
                progress(f"round {round_no + 1}, idle fetcher {label}: broker {cost} core")
    result = probe_result(
        "fetch-wait",
        after_commit_ms={str(w): percentiles(v) for w, v in wake.items()},
        lost_commits={str(w): args.rounds * args.commits - len(v) for w, v in wake.items()},
        idle_broker_cores=idle,
        config={
            "waits_ms": args.waits,
            "commits_per_round": args.commits,
            "rounds": args.rounds,
            "idle_s": args.idle_s,
            "partitions": PARTITIONS,
            "measured": "ms from commit_transaction's return to the record's arrival at an idle "
            "read_committed consumer; broker CPU cores with one idle fetcher of 60 partitions",
            "command": f"./run bench fetch --waits {' '.join(map(str, args.waits))} "
            f"--commits {args.commits} --rounds {args.rounds}",
        },
    )
    write_result("fetch-wait", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
