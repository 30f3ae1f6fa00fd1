"""``./run bench <suite> ...``: run one benchmark suite (``--help`` lists the scenarios)."""

from __future__ import annotations

import importlib
import sys

SUITES = {
    "scheduler": "bench.scheduler",
    "dag": "bench.dag_bench",
    "worker": "bench.worker_throughput",
    "api": "bench.api_projector",
    "day": "bench.day",
    "compare": "bench.compare",
    "http": "bench.http_rate",
    "limits": "bench.limits",
    "fetch": "bench.fetch_wait",
    "txn": "bench.txn_backoff",
}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in SUITES:
        print(f"usage: ./run bench {{{','.join(SUITES)}}} <scenario> [options]", file=sys.stderr)
        return 2
    module = importlib.import_module(SUITES[sys.argv[1]])
    return int(module.main(sys.argv[2:]))


if __name__ == "__main__":
    sys.exit(main())
