"""Print the README's reliability table from ``bench/results/faults-*.json``.

.venv/bin/python -m tests.faults.table
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def row(name: str, r: dict[str, Any]) -> str:
    def fmt(value: Any) -> str:
        if value is None:
            return "–"
        if isinstance(value, float):
            return f"{value:,.1f}"
        return f"{value:,}"

    occurrences = r.get("expected_occurrences") or r.get("jobs")
    return (
        f"| {name} | {r.get('size', '?')} | {fmt(r.get('jobs'))} / {fmt(occurrences)} | "
        f"{fmt(r.get('lost'))} | {fmt(r.get('duplicate_effects'))} | "
        f"{fmt(r.get('duplicate_requests'))} | {fmt(r.get('aborted_reads'))} | "
        f"{fmt(r.get('redelivered'))} | {fmt(r.get('recovery_s'))} | "
        f"{fmt(_int(r.get('max_lateness_ms')))} | {r.get('finished_at', '')[:16]} |"
    )


def _int(value: Any) -> int | None:
    return None if value is None else round(value)


def main() -> None:
    print(
        "| scenario | size | jobs / occurrences | lost | duplicate effects | duplicate requests "
        "| aborted reads | second attempts | recovery s | max lateness ms | run (UTC) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for path in sorted(RESULTS.glob("faults-*.json")):
        result = json.loads(path.read_text())
        print(row(path.stem.removeprefix("faults-").removesuffix("-ci"), result))


if __name__ == "__main__":
    main()
