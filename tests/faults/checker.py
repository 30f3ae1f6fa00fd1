"""The offline checker of a fault-campaign history (Jepsen-style: observe, then judge).

Pure: it takes the events of a history (see ``history.py``) and returns a :class:`Report`.
What it judges, and how:

- **lost**: an expected occurrence (``job.expect_ms``) with no execution request seen by the
  read_committed recorder, or, when the scenario expects effects, with no successful (2xx)
  delivery at the sink.
- **unexpected**: with ``job.exact``, a request for an occurrence the job did not expect (a
  misfire policy that ran what it declared it would skip).
- **duplicate requests**: one ``(job_id, scheduled_at_ms, attempt)`` requested twice, or one
  occurrence ``(job_id, scheduled_at_ms)`` requested under two execution ids.
- **duplicate effects**: one occurrence that reached the sink successfully under two
  Idempotency-Keys, or a successful delivery without a key. (The sink is an idempotent
  consumer: the same key delivered twice is one effect. Those second deliveries are counted
  as ``redelivered``: the visible second attempts that at-least-once allows.)
- **aborted reads**: records the live read_committed recorder saw that the final audit found
  to belong to aborted transactions; **lost reads**: records it saw that a final
  read_uncommitted reader no longer finds.
- **hanging transactions**: partitions whose last stable offset never caught up with the
  high watermark after the roles stopped.
- **stuck**: executions whose final projected status is not terminal (when ``terminal``).
- **lateness**: start lateness (first delivery of an execution − its due time) or, without a
  sink, emit lateness (emitted − due); p50, p99, max in ms.
- **recovery**: per fault, seconds from its end until the work it caught was done (see
  :func:`_recovery_s`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.common import percentiles
from duetime.core.states import TERMINAL

Occurrence = tuple[str, int]


@dataclass
class Report:
    scenario: str
    jobs: int
    expected_occurrences: int
    requests: int
    executions: int
    effects: int
    lost: list[Occurrence] = field(default_factory=list)
    unexpected: list[Occurrence] = field(default_factory=list)
    duplicate_requests: list[Any] = field(default_factory=list)
    duplicate_effects: list[Any] = field(default_factory=list)
    aborted_reads: list[Any] = field(default_factory=list)
    lost_reads: list[Any] = field(default_factory=list)
    hanging_partitions: list[Any] = field(default_factory=list)
    stuck: list[Any] = field(default_factory=list)
    redelivered: int = 0
    aborted_records: int = 0
    start_lateness_ms: dict[str, float | None] = field(default_factory=dict)
    emit_lateness_ms: dict[str, float | None] = field(default_factory=dict)
    recovery_s: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.unexpected
            or self.duplicate_requests
            or self.duplicate_effects
            or self.aborted_reads
            or self.lost_reads
            or self.hanging_partitions
            or self.stuck
        )

    def figures(self) -> dict[str, Any]:
        """The counts and measures (no lists): what the results JSON and the README show."""
        lateness = self.start_lateness_ms if self.effects else self.emit_lateness_ms
        return {
            "scenario": self.scenario,
            "jobs": self.jobs,
            "expected_occurrences": self.expected_occurrences,
            "requests": self.requests,
            "executions": self.executions,
            "effects": self.effects,
            "lost": len(self.lost),
            "unexpected": len(self.unexpected),
            "duplicate_requests": len(self.duplicate_requests),
            "duplicate_effects": len(self.duplicate_effects),
            "aborted_reads": len(self.aborted_reads),
            "lost_reads": len(self.lost_reads),
            "hanging_partitions": len(self.hanging_partitions),
            "stuck": len(self.stuck),
            "redelivered": self.redelivered,
            "aborted_records": self.aborted_records,
            "start_lateness_ms": self.start_lateness_ms,
            "emit_lateness_ms": self.emit_lateness_ms,
            "max_lateness_ms": lateness.get("max"),
            "recovery_s": max(self.recovery_s.values(), default=0.0),
            "recovery_s_by_fault": self.recovery_s,
            "ok": self.ok,
        }

    def summary(self) -> str:
        """A failure message naming the first few offenders of each kind."""
        parts = []
        for name, value in asdict(self).items():
            if isinstance(value, list) and value:
                parts.append(f"{name}: {len(value)} (e.g. {value[:3]})")
        return "; ".join(parts) or "ok"


def _ok(status: Any) -> bool:
    return isinstance(status, int) and 200 <= status < 300


def check(events: list[dict[str, Any]]) -> Report:
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_kind[e["kind"]].append(e)
    config: dict[str, Any] = {}
    for c in by_kind["config"]:
        config.update(c)
    expect_effects = bool(config.get("effects"))
    jobs = {j["job_id"]: j for j in by_kind["job"]}
    requests = by_kind["request"]
    req = _requests(requests)
    eff = _effects(by_kind["delivery"], req.first_request)
    lost, unexpected, expected_total = _lost_and_unexpected(
        jobs, eff.occurrences if expect_effects else req.occurrences, req.occurrences
    )
    aborted, aborted_reads, lost_reads, hanging = _reads(by_kind["audit"], requests)
    stuck = _stuck(by_kind["status"], req.first_request) if config.get("terminal") else []

    # --- lateness and recovery ------------------------------------------------------------
    first_request, first_delivery_ms = req.first_request, eff.first_delivery_ms
    start_lateness = [
        float(first_delivery_ms[e] - r["due_at_ms"])
        for e, r in first_request.items()
        if e in first_delivery_ms
    ]
    emit_lateness = [float(r["emitted_at_ms"] - r["due_at_ms"]) for r in first_request.values()]
    recovery = {
        f["name"]: _recovery_s(
            f, first_request, first_delivery_ms, eff.first_effect_ms, expect_effects
        )
        for f in by_kind["fault"]
    }
    return Report(
        scenario=str(config.get("scenario", "")),
        jobs=len(jobs),
        expected_occurrences=expected_total,
        requests=len(requests),
        executions=len(first_request),
        effects=len(eff.first_effect_ms),
        lost=lost,
        unexpected=unexpected,
        duplicate_requests=req.duplicates,
        duplicate_effects=eff.duplicates,
        aborted_reads=aborted_reads,
        lost_reads=lost_reads,
        hanging_partitions=hanging,
        stuck=stuck,
        redelivered=sum(1 for n in eff.successes_per_key.values() if n > 1),
        aborted_records=len(aborted),
        start_lateness_ms=percentiles(start_lateness),
        emit_lateness_ms=percentiles(emit_lateness),
        recovery_s=recovery,
    )


@dataclass
class _Requests:
    first_request: dict[str, dict[str, Any]]
    """execution id → its first request record (lowest attempt, earliest)."""
    occurrences: set[Occurrence]
    duplicates: list[Any]


def _requests(requests: list[dict[str, Any]]) -> _Requests:
    """Requests: one execution id per occurrence, one record per attempt."""
    per_attempt = Counter((r["job_id"], r["scheduled_at_ms"], r["attempt"]) for r in requests)
    ids_per_occurrence: dict[Occurrence, set[str]] = defaultdict(set)
    first_request: dict[str, dict[str, Any]] = {}
    for r in sorted(requests, key=lambda r: (r["attempt"], r["t_ms"])):
        ids_per_occurrence[(r["job_id"], r["scheduled_at_ms"])].add(r["execution_id"])
        first_request.setdefault(r["execution_id"], r)
    duplicates: list[Any] = [
        {"job_id": j, "scheduled_at_ms": s, "attempt": a, "copies": n}
        for (j, s, a), n in per_attempt.items()
        if n > 1
    ]
    duplicates += [
        {"job_id": j, "scheduled_at_ms": s, "execution_ids": sorted(ids)}
        for (j, s), ids in ids_per_occurrence.items()
        if len(ids) > 1
    ]
    return _Requests(first_request, set(ids_per_occurrence), duplicates)


@dataclass
class _Effects:
    first_delivery_ms: dict[str, int]
    first_effect_ms: dict[str, int]
    successes_per_key: Counter[str]
    occurrences: set[Occurrence]
    duplicates: list[Any]


def _effects(
    deliveries: list[dict[str, Any]], first_request: dict[str, dict[str, Any]]
) -> _Effects:
    """Effects: a successful delivery; one key per occurrence."""
    keys_per_occurrence: dict[Occurrence, set[str]] = defaultdict(set)
    successes_per_key: Counter[str] = Counter()
    first_delivery_ms: dict[str, int] = {}
    first_effect_ms: dict[str, int] = {}
    duplicates: list[Any] = []
    for d in sorted(deliveries, key=lambda d: d["at_ms"]):
        key = d.get("key") or ""
        if key:
            first_delivery_ms.setdefault(key, d["at_ms"])
        if not _ok(d.get("status")):
            continue
        if not key:
            duplicates.append({"missing_key": True, "job_id": d.get("job_id")})
            continue
        successes_per_key[key] += 1
        first_effect_ms.setdefault(key, d["at_ms"])
        request = first_request.get(key)
        occurrence = (
            (request["job_id"], request["scheduled_at_ms"])
            if request is not None
            else (d.get("job_id", ""), d.get("scheduled_at_ms", -1))
        )
        keys_per_occurrence[occurrence].add(key)
    duplicates += [
        {"job_id": j, "scheduled_at_ms": s, "keys": sorted(keys)}
        for (j, s), keys in keys_per_occurrence.items()
        if len(keys) > 1
    ]
    return _Effects(
        first_delivery_ms, first_effect_ms, successes_per_key, set(keys_per_occurrence), duplicates
    )


def _lost_and_unexpected(
    jobs: dict[str, dict[str, Any]], done: set[Occurrence], requested: set[Occurrence]
) -> tuple[list[Occurrence], list[Occurrence], int]:
    """Expected occurrences not ``done``; requested ones an ``exact`` job did not expect; and
    how many were expected."""
    lost: list[Occurrence] = []
    unexpected: list[Occurrence] = []
    expected_total = 0
    for job_id, job in jobs.items():
        expect = job.get("expect_ms")
        if expect is None:
            continue
        expect_set = set(expect)
        expected_total += len(expect_set)
        lost += [(job_id, t) for t in sorted(expect_set) if (job_id, t) not in done]
        if job.get("exact"):
            unexpected += sorted(
                (j, s) for (j, s) in requested if j == job_id and s not in expect_set
            )
    return lost, unexpected, expected_total


def _reads(
    audits: list[dict[str, Any]], requests: list[dict[str, Any]]
) -> tuple[set[tuple[str, int, int]], list[Any], list[Any], list[Any]]:
    """Reads against the final audit: the aborted records, the reads of aborted records, the
    reads of records no longer in the log, and the partitions left with an open transaction."""
    aborted: set[tuple[str, int, int]] = set()
    uncommitted: dict[tuple[str, int], set[int]] | None = None
    hanging: list[Any] = []
    for a in audits:
        aborted |= {(t, p, o) for t, p, o in a.get("aborted", [])}
        if a.get("uncommitted") is not None:
            uncommitted = defaultdict(set)
            for t, p, offsets in a["uncommitted"]:
                uncommitted[(t, p)] |= set(offsets)
        hanging += [x for x in a.get("lso", []) if not x.get("settled", True)]
    seen = [(r["topic"], r["partition"], r["offset"]) for r in requests if "offset" in r]
    aborted_reads = [x for x in seen if x in aborted]
    lost_reads = (
        [x for x in seen if x[2] not in uncommitted.get((x[0], x[1]), set())]
        if uncommitted is not None
        else []
    )
    return aborted, aborted_reads, lost_reads, hanging


def _stuck(statuses: list[dict[str, Any]], first_request: dict[str, dict[str, Any]]) -> list[Any]:
    """Executions whose final status is not terminal (or missing)."""
    final: dict[str, str] = {}
    for s in statuses:
        final[s["execution_id"]] = s["status"]
    return [
        {"execution_id": e, "status": final.get(e, "missing")}
        for e in sorted(first_request)
        if final.get(e) not in TERMINAL
    ]


def _recovery_s(
    fault: dict[str, Any],
    first_request: dict[str, dict[str, Any]],
    first_delivery_ms: dict[str, int],
    first_effect_ms: dict[str, int],
    expect_effects: bool,
) -> float:
    """Seconds from the fault's end until the work it caught was done, and at least until the
    first progress after it (when there was any).

    Caught work: with effects, executions that had reached the sink before the fault started
    but had no effect yet (in flight), and executions due during the fault; without effects,
    occurrences due before the fault ended whose request came after it started.
    """
    start: int = fault["start_ms"]
    end: int = fault.get("end_ms") or start
    done_at: list[int] = []
    progress = (
        first_effect_ms if expect_effects else {e: r["t_ms"] for e, r in first_request.items()}
    )
    for e, r in first_request.items():
        done = progress.get(e)
        if done is None or done < start:
            continue
        if expect_effects:
            in_flight = first_delivery_ms.get(e, done) < start
            due_during = start <= r["due_at_ms"] <= end
            if in_flight or due_during:
                done_at.append(done)
        elif r["due_at_ms"] <= end:
            done_at.append(done)
    after = [t for t in progress.values() if t >= end]
    if after:
        done_at.append(min(after))
    if not done_at:
        return 0.0
    return round(max(0.0, (max(done_at) - end) / 1000), 3)
