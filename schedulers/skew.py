"""The scheduler's clock check: how far its wall clock is from the broker's, and what it may do.

A scheduler fires a job when its own wall clock says the job is due; a clock 30 s ahead fires
every job 30 s early and nothing else notices (issue 14, item 8). Kafka tells a client the
broker's time in one place only: the timestamp of a record appended to a topic whose
``message.timestamp.type`` is ``LogAppendTime`` (the broker stamps it when it appends and
returns it in the produce response). duetime's other topics keep ``CreateTime`` (the
producer's own clock: useless here), so the schedulers write a small probe record to the
``<prefix>clock`` topic (one partition, LogAppendTime, short retention) every
``DUETIME_SCHEDULER_CLOCK_PROBE_S`` from a thread beside the loop, never in a cycle.

One probe: local wall time at send ``t0``, round trip ``rtt`` (monotonic), broker stamp ``b``.
The broker stamped the record somewhere within the round trip, so the local clock's offset
from the broker lies in ``[t0 - b, t0 + rtt - b]``: the estimate is its middle and the error
at most half the round trip (plus the stamp's millisecond). The verdict is pure (``judge``):

- firing is allowed only while the latest fresh probe shows the clock certainly within
  ``DUETIME_SCHEDULER_MAX_CLOCK_SKEW_S`` (``|offset| + error <= bound``); a probe certainly
  beyond it stops firing; a probe that cannot tell (error too large) keeps the last verdict
  while that verdict is fresh;
- no fresh verdict (the first probe not back yet, the probe failing) also stops firing:
  a scheduler that cannot check its clock does not fire on it;
- not allowed to fire for ``DUETIME_SCHEDULER_CLOCK_GIVE_UP_S`` in a row, the scheduler
  leaves the group, so a healthy member takes its partitions; it joins again once a probe
  shows its clock good. A scheduler that starts with a bad clock never joins.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, Message, Producer

from duetime.core import kafka
from duetime.core.clock import Clock
from duetime.core.config import CommonSettings
from duetime.core.redact import redact_text

from . import metrics

log = logging.getLogger("duetime.scheduler")


@dataclass(frozen=True, slots=True)
class Sample:
    """One probe: the local clock's offset from the broker's (positive: local is ahead)."""

    offset_ms: float
    error_ms: float
    """At most this far from the true offset (half the round trip, plus the stamp's ms)."""
    taken_s: float
    """Monotonic time the probe came back."""
    wall_ms: float
    """The local wall clock at ``taken_s`` (as the probe estimated it)."""

    def at(self, now_s: float, now_wall_ms: float) -> Sample:
        """This probe carried forward to now on the monotonic clock, which no one steps: a
        wall clock set 30 s ahead since the probe shows at once, not at the next probe."""
        stepped_ms = (now_wall_ms - self.wall_ms) - (now_s - self.taken_s) * 1000
        return Sample(self.offset_ms + stepped_ms, self.error_ms, now_s, now_wall_ms)


def sample_of(sent_wall_ms: int, rtt_s: float, broker_ms: int, taken_s: float) -> Sample:
    """A probe's offset estimate: the middle of the interval the broker's stamp allows."""
    rtt_ms = max(0.0, rtt_s * 1000)
    return Sample(
        offset_ms=sent_wall_ms + rtt_ms / 2 - broker_ms,
        error_ms=rtt_ms / 2 + 1,  # the broker stamps whole milliseconds
        taken_s=taken_s,
        wall_ms=sent_wall_ms + rtt_ms,
    )


class Verdict(enum.Enum):
    GOOD = "good"
    """Within the bound, for certain: firing allowed."""
    SKEWED = "skewed"
    """Beyond the bound, for certain."""
    UNKNOWN = "unknown"
    """No fresh probe that could tell."""


def classify(sample: Sample, bound_ms: float) -> Verdict:
    """One probe against the bound: GOOD, SKEWED, or UNKNOWN when its error straddles it."""
    distance = abs(sample.offset_ms)
    if distance + sample.error_ms <= bound_ms:
        return Verdict.GOOD
    if distance - sample.error_ms > bound_ms:
        return Verdict.SKEWED
    return Verdict.UNKNOWN


@dataclass(frozen=True, slots=True)
class Decision:
    fire: bool
    member: bool
    """Stay in (or join) the schedulers' group."""
    verdict: Verdict
    reason: str
    offset_ms: float | None = None
    """The clock's offset now (the freshest usable probe carried forward), if known."""


@dataclass
class SkewGuard:
    """The scheduler's verdict on its clock, from probes (pure: monotonic time passed in)."""

    bound_ms: float
    give_up_s: float
    stale_s: float
    """A verdict older than this is no verdict (a few probe intervals)."""
    last: Sample | None = None
    conclusive: Sample | None = None
    """The last probe that could tell (GOOD or SKEWED when it came back)."""
    unfit_since_s: float | None = None
    """Since when firing has not been allowed (None: it is); set at creation, so a scheduler
    that never had a good clock never joins."""
    ever_good: bool = False

    def observe(self, sample: Sample) -> None:
        self.last = sample
        if classify(sample, self.bound_ms) is not Verdict.UNKNOWN:
            self.conclusive = sample

    def decide(self, now_s: float, now_wall_ms: float) -> Decision:
        """The verdict now: the latest fresh probe, or the last one that could tell."""
        verdict, current = Verdict.UNKNOWN, None
        for sample in (self.last, self.conclusive):
            if sample is None or now_s - sample.taken_s > self.stale_s:
                continue
            current = sample.at(now_s, now_wall_ms)
            verdict = classify(current, self.bound_ms)
            if verdict is not Verdict.UNKNOWN:
                break
        offset_ms = None if current is None else current.offset_ms
        if verdict is Verdict.GOOD:
            self.unfit_since_s = None
            self.ever_good = True
            return Decision(True, True, verdict, self._reason(verdict, current), offset_ms)
        if self.unfit_since_s is None:
            self.unfit_since_s = now_s
        # never good since start: never take partitions on a clock that was never checked good
        member = self.ever_good and now_s - self.unfit_since_s < self.give_up_s
        return Decision(False, member, verdict, self._reason(verdict, current), offset_ms)

    def _reason(self, verdict: Verdict, current: Sample | None) -> str:
        if current is None:
            if self.last is None:
                return "clock offset from the broker not measured yet"
            return (
                f"no clock probe for {self.stale_s:g} s: the offset from the broker is unknown "
                "(see the clock probe's warnings)"
            )
        measured = (
            f"wall clock {current.offset_ms / 1000:+.3f} s (±{current.error_ms / 1000:.3f} s) "
            f"from the broker's; DUETIME_SCHEDULER_MAX_CLOCK_SKEW_S={self.bound_ms / 1000:g} s"
        )
        if verdict is Verdict.GOOD:
            return measured
        if verdict is Verdict.SKEWED:
            return f"{measured}: over the bound"
        return f"{measured}: the measurement cannot tell (its round trip was too slow)"


class ClockProbe:
    """A thread that measures the clock's offset from the broker every ``interval_s`` and
    feeds a :class:`SkewGuard` (the main loop only reads ``decide``: no round trip in a
    cycle)."""

    def __init__(
        self,
        common: CommonSettings,
        topic: str,
        clock: Clock,
        guard: SkewGuard,
        interval_s: float,
    ) -> None:
        self.topic = topic
        self.clock = clock
        self.guard = guard
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._producer: Producer = kafka.producer(
            common,
            # one small record, sent alone: no batching delay inside the measured round trip
            # a probe that cannot be delivered within an interval is a failed probe, not one
            # to keep retrying for librdkafka's default 5 minutes
            **{
                "linger.ms": 0,
                "enable.idempotence": False,
                "acks": "1",
                "message.timeout.ms": int(max(5.0, interval_s) * 1000),
            },
        )
        self._thread = threading.Thread(target=self._run, name="clock-probe", daemon=True)
        self._failures = 0

    def start(self) -> None:
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def decide(self, now_wall_ms: int) -> Decision:
        """The verdict for a cycle that runs at ``now_wall_ms`` (its clock reading)."""
        with self._lock:
            return self.guard.decide(time.monotonic(), now_wall_ms)

    def wait_first(self, timeout_s: float) -> None:
        """Wait (bounded) for the first probe's answer, so the verdict at start is informed."""
        deadline = time.monotonic() + timeout_s
        while self.guard.last is None and self._failures == 0 and time.monotonic() < deadline:
            self._stop.wait(0.01)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.probe_once()
                self._stop.wait(self.interval_s)
        finally:
            self._producer.flush(1)

    def probe_once(self) -> Sample | None:
        """Send one probe and wait for its broker stamp; None (logged, counted) on failure."""
        got: list[Message] = []
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                got.append(msg)
            else:
                errors.append(err)

        sent_wall_ms = self.clock.now_ms()
        sent_s = time.monotonic()
        try:
            self._producer.produce(self.topic, value=b"", on_delivery=delivered)
            # a first probe also waits for the connection and the topic's metadata
            self._producer.flush(max(5.0, self.interval_s))
        except Exception as exc:  # a client error must not end the probe thread
            self._failed(f"{type(exc).__name__}: {exc}")
            return None
        back_s = time.monotonic()
        if errors or not got:
            self._failed(str(errors[0]) if errors else "no answer from the broker")
            return None
        kind, stamp_ms = got[0].timestamp()
        if kind != TIMESTAMP_LOG_APPEND_TIME:
            self._failed(
                f"topic {self.topic} does not use LogAppendTime: it cannot give the broker's "
                "time (create it with `duetime topics create`)"
            )
            return None
        sample = sample_of(sent_wall_ms, back_s - sent_s, stamp_ms, back_s)
        with self._lock:
            self.guard.observe(sample)
        self._failures = 0
        metrics.CLOCK_OFFSET.set(sample.offset_ms / 1000)
        metrics.CLOCK_ERROR.set(sample.error_ms / 1000)
        return sample

    def _failed(self, why: str) -> None:
        self._failures += 1
        metrics.CLOCK_PROBE_FAILURES.inc()
        # the first failure, then a reminder now and then: a broken probe stops firing, so it
        # must be visible, but not one line every probe interval
        if self._failures in (1, 10) or self._failures % 60 == 0:
            log.warning(
                "clock probe failed (%s in a row): %s",
                self._failures,
                redact_text(why),
                extra={"topic": self.topic},
            )


def describe(decision: Decision) -> dict[str, Any]:
    """Fixed log fields of a firing decision."""
    return {"verdict": decision.verdict.value, "firing": decision.fire, "member": decision.member}
