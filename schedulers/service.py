"""The scheduler role: a consumer-group member that owns partitions and fires their jobs.

Main loop, one screen: stop requested? → consume with a timeout bounded by the next due time
→ apply the records to their partitions → fire what is due → commit each partition's cycle in
its own transaction. Assignment restores a partition from its changelog before anything fires
for it; revocation drops it at once.

Rebalancing is incremental (the KIP-848 consumer protocol with the broker's range assignor,
which gives partition p of every input topic to one member): a scheduler joining or leaving
moves only the partitions that change owner, and the others keep firing throughout.
"""

from __future__ import annotations

import contextlib
import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Protocol, TypeVar

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from duetime.core import kafka
from duetime.core.clock import SYSTEM_CLOCK, Clock
from duetime.core.poison import PRODUCER_MAX_BYTES
from duetime.core.queues import QueueDirectory, partition_counts
from duetime.core.topics import Topics
from duetime.schemas.codec import Codec

from . import logic, metrics, skew
from .partition import PartitionLost, PartitionOwner
from .restores import Restored, Restores
from .settings import SchedulerSettings
from .standby import STANDBY_CACHE_KIB, Copy, Standby
from .store import StateStore

log = logging.getLogger("duetime.scheduler")


def fire_order(partitions: Iterable[int], first: int) -> list[int]:
    """The order a cycle fires its partitions in: ascending, from the first one at or after
    ``first`` (where the last cycle's fire budget ran out), wrapping around. In a burst every
    partition gets its turn, and none waits behind the others' whole backlogs."""
    ordered = sorted(partitions)
    start = next((i for i, p in enumerate(ordered) if p >= first), 0)
    return ordered[start:] + ordered[:start]


class _Proven(Protocol):
    proven_at: float


_Owner = TypeVar("_Owner", bound=_Proven)


def unproven(owners: Mapping[int, _Owner], busy: Sequence[_Owner], since: float) -> list[_Owner]:
    """The owners, in partition order, that were not committing in a round (``busy``) and
    whose producers have not answered since ``since`` (``PartitionOwner.proven_at``)."""
    return [o for _, o in sorted(owners.items()) if o not in busy and o.proven_at < since]


def read_limit(bursting: bool, batch_size: int, cycle_fire_limit: int) -> int:
    """Input records a cycle reads: a fifth of the fire budget while a burst is being fired
    (the last cycle's budget ran out with jobs still due), else a whole batch. The results of
    a burst's first slices flood in while its next slices wait, and applying a result costs
    half a fire: they are read a little at a time until the burst is out (bounded by the
    burst, never stopped: at least one record a cycle)."""
    if bursting:
        return max(1, min(batch_size, cycle_fire_limit // 5))
    return batch_size


class Scheduler:
    def __init__(self, settings: SchedulerSettings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.common = settings.common
        self.clock = clock or SYSTEM_CLOCK
        self.topics = Topics(self.common.topic_prefix)
        # keep_definitions: a state's definition is written as the bytes it was read as
        self.codec = Codec(registry_url=self.common.schema_registry_url, keep_definitions=True)
        self.owners: dict[int, PartitionOwner] = {}
        self.policy = logic.Policy(
            misfire_threshold_ms=int(settings.misfire_threshold_s * 1000),
            catch_up_cap=settings.catch_up_cap,
            catch_up_window_s=settings.catch_up_window_s,
            lease_ttl_ms=int(settings.lease_ttl_s * 1000),
            rescue_grace_ms=int(settings.rescue_grace_s * 1000),
            max_rescues=settings.max_rescues,
            rescue_horizon_ms=int(settings.rescue_horizon_s * 1000),
            fairness_inflight=settings.fairness_inflight,
            fire_lead_ms=settings.fire_lead_ms,
            crowd_rate_per_s=settings.crowd_rate,
            crowd_lead_max_ms=settings.crowd_lead_max_ms,
        )
        self.rng = random.Random()
        # which queues have topics: a request to a missing one is dead-lettered rather than
        # failing its transaction (partition.py); a short timeout: the loop asks it
        self.queues = QueueDirectory(
            self.topics,
            lambda timeout_s: partition_counts(self.consumer.list_topics(timeout=timeout_s)),
            timeout_s=2.0,
            min_partitions=self.common.partitions,
        )
        self._stop = threading.Event()
        self.group_id = f"{self.common.topic_prefix}schedulers"
        # the clients exist from the start (the rebalance callbacks and shutdown use them); the
        # consumer joins the group only when run() subscribes it
        self.consumer: Consumer = self._group_consumer()
        self._restore_consumer: Consumer = self._restore_reader()
        self.restores = Restores(
            self._build, self._ready_restore_reader, ready=self.common.partitions
        )
        """Partitions assigned here, being fenced and restored off the loop (restores.py)."""
        self.standby: Standby | None = None
        """Warm copies of the partitions not owned here (standby.py); started by ``run``."""
        self._standby_wanted: frozenset[int] | None = None
        self._fences = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fence")
        """The new producers' ``init_transactions``, beside their partitions' restores."""
        self.on_restored: Callable[[int, int, float], None] | None = None
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="commit")
        self._lost: dict[int, PartitionOwner | None] = {}
        """Partitions whose producer was fenced or broke (with the owner that failed, None when
        it was dropped already): started over at the next cycle."""
        self._retakes: dict[int, int] = {}
        self._fatal: str | None = None
        self.probe = skew.ClockProbe(
            self.common,
            self.topics.clock,
            self.clock,
            skew.SkewGuard(
                bound_ms=settings.max_clock_skew_s * 1000,
                give_up_s=settings.clock_give_up_s,
                stale_s=settings.clock_stale_s,
            ),
            settings.clock_probe_s,
        )
        self.firing = False
        """Fire due jobs and emit execution requests: only while the clock is checked good."""
        self.member = False
        """Subscribed to the schedulers' group (left while the clock stays bad)."""
        self._held_inputs: set[tuple[str, int]] = set()
        """Input partitions paused at a record that would emit while firing is stopped."""
        self._fire_next = 0
        """The partition the next cycle fires first (where the last cycle's budget ran out)."""
        self._bursting = False
        """The last cycle's fire budget ran out: more jobs are due than a cycle fires."""

    def _restore_reader(self) -> Consumer:
        # the restore reader needs no group: it reads a state partition from its beginning
        return kafka.consumer(
            self.common,
            f"{self.group_id}-restore",
            **{
                "enable.partition.eof": True,
                # requests on a connection are served in order: a fetch parked for the default
                # 500 ms would delay every watermark query behind it during a failover
                "fetch.wait.max.ms": 10,
                # up to 8 restores read at once (restores.py): 16 MB read ahead each (default
                # 64 MB) is still two of restore's 5,000-record batches of ~1.5 KB states
                "queued.max.messages.kbytes": 16384,
                # once that much is queued, librdkafka waits this long before fetching again
                # (default 1,000 ms): a restore that read its batch found the queue empty and
                # waited 0.5-0.7 s for the next fetch, twice a 30,000-state partition
                "fetch.queue.backoff.ms": 10,
            },
        )

    def _ready_restore_reader(self) -> Consumer:
        """A restore reader connected to the broker, the state topic's leader known."""
        reader = self._restore_reader()
        with contextlib.suppress(KafkaException):  # the restore's own calls wait and retry
            reader.list_topics(self.topics.state, timeout=5)
        return reader

    def _group_consumer(self) -> Consumer:
        # KIP-848: incremental rebalances (a member joining or leaving moves only the
        # partitions that change owner; the classic protocol's eager rebalance stopped every
        # partition of every member, 2.7 s of lateness at 1,000 jobs/s), and the broker's range
        # assignor keeps co-partitioning. The session timeout and heartbeat interval are the
        # group's (configure_group), not the client's.
        return kafka.kip848_consumer(self.common, self.group_id)

    def _configure_group(self) -> None:
        """Give the schedulers' group its own session timeout and heartbeat interval
        (:func:`kafka.set_group_timing`). Failover is detection (the session timeout) + the
        survivor's next heartbeat + restore, so both matter. Refused, the scheduler still
        runs, fails over slower, and says so."""
        refused = kafka.set_group_timing(
            self.common,
            self.group_id,
            self.settings.session_timeout_ms,
            self.settings.heartbeat_interval_ms,
        )
        if refused is not None:
            log.warning(
                "the schedulers' group keeps the broker's session timeout and heartbeat "
                "interval (DUETIME_SESSION_TIMEOUT_MS=%s and "
                "DUETIME_SCHEDULER_HEARTBEAT_INTERVAL_MS=%s were refused; failover is slower): %s",
                self.settings.session_timeout_ms,
                self.settings.heartbeat_interval_ms,
                refused,
            )

    # --- lifecycle ------------------------------------------------------------------------

    def stop(self, *_: Any) -> None:
        self._stop.set()

    def run(self) -> None:
        metrics.FIRING.set(0)
        self._configure_group()
        self.probe.start()
        # the first verdict before joining: a scheduler that starts with a bad clock never
        # takes partitions (bounded: without an answer it joins and waits to fire)
        self.probe.wait_first(5.0)
        if self.settings.standby:
            self.standby = self._new_standby()
            self._warm_standby(self.standby)
        log.info("scheduler started", extra={"role": "scheduler"})
        failures = 0
        metrics.PARTITIONS.set(self.common.partitions)
        next_housekeeping = 0.0
        try:
            while not self._stop.is_set():
                try:
                    self._cycle()
                    failures = 0
                    if time.monotonic() >= next_housekeeping:
                        self._housekeeping()
                        next_housekeeping = time.monotonic() + 5.0
                except (KafkaException, OSError) as exc:
                    failures += 1
                    metrics.LOOP_ERRORS.inc()
                    log.warning("scheduler cycle failed (%s in a row): %s", failures, exc)
                    if failures >= 50:
                        raise SystemExit(
                            f"scheduler: {failures} cycles failed in a row: {exc}"
                        ) from exc
                    time.sleep(min(2.0, 0.05 * failures))
                if self._fatal:
                    raise SystemExit(f"scheduler: {self._fatal}")
                if self._lost:
                    self._retake_lost()
        finally:
            self.probe.stop()
            self._pool.shutdown()
            self._shutdown()

    def _new_standby(self) -> Standby:
        state_dir = self.settings.state_dir
        window_ms = int(self.settings.window_s * 1000)
        return Standby(
            self.topics.state,
            self.common.partitions,
            self._standby_reader,
            lambda path: StateStore(path, window_ms, cache_kib=STANDBY_CACHE_KIB),
            None if state_dir is None else state_dir / self.common.instance_id,
        )

    def _standby_reader(self) -> Consumer:
        # never a member, like the restore reader; a standby needs no 10 ms fetch wait (a copy
        # a fraction of a second behind only leaves a longer tail to the restore), and an idle
        # one costs the broker a fetch a quarter second
        return kafka.consumer(
            self.common,
            f"{self.group_id}-standby",
            **{
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 250,
                "queued.max.messages.kbytes": 16384,
            },
        )

    def _warm_standby(self, standby: Standby) -> None:
        """Wait (at most DUETIME_SCHEDULER_STANDBY_WARM_S) for the standby's copies to reach
        the changelog's end before joining, so partitions given to this scheduler at its join
        are restored from copies (their tails only)."""
        started = time.monotonic()
        deadline = started + self.settings.standby_warm_s
        next_report = started + 5.0
        while not standby.caught_up() and not self._stop.is_set():
            now = time.monotonic()
            if now >= deadline:
                log.warning(
                    "joining before the standby caught up (DUETIME_SCHEDULER_STANDBY_WARM_S=%s): "
                    "partitions given now restore from the changelog",
                    self.settings.standby_warm_s,
                )
                return
            if now >= next_report:
                log.info("warming the standby up: %s", standby.describe())
                next_report = now + 5.0
            time.sleep(0.05)
        log.info("standby warm in %.2f s: %s", time.monotonic() - started, standby.describe())

    def _follow_standby(self) -> None:
        """Tell the standby which partitions to follow: those neither owned, being taken nor
        waiting to be retaken here (only when that changed: its lock is shared with its
        thread's writes)."""
        if self.standby is None:
            return
        busy = set(self.owners) | self.restores.pending() | set(self._lost)
        wanted = frozenset(p for p in range(self.common.partitions) if p not in busy)
        if wanted != self._standby_wanted:
            self.standby.follow(wanted)
            self._standby_wanted = wanted

    def _shutdown(self) -> None:
        if self.standby is not None:
            self.standby.close()
        self.restores.close()
        self._fences.shutdown()
        self._flush_all()
        for p in list(self.owners):
            self._drop(p)
        self.consumer.close()  # leaves the group: partitions move at once
        self._restore_consumer.close()
        metrics.OWNED.set(0)
        log.info("scheduler stopped")

    # --- the loop -------------------------------------------------------------------------

    def _cycle(self) -> None:
        if self.restores.pending():
            self._install_restored()
        msgs = kafka.read_batch(self.consumer, self._read_limit(), self._poll_timeout_s())
        now_ms = self.clock.now_ms()
        # judged on the very reading the cycle fires with: a clock stepped since the last
        # probe stops this cycle's fires, not the next probe's
        self._check_clock(now_ms)
        self._prefetch(msgs)
        for msg in msgs:
            if msg.error():
                log.warning("consume error: %s", msg.error())
                continue
            p = msg.partition() or 0
            if (msg.topic() or "", p) in self._held_inputs:
                continue  # rewound to a held record: the rest of the batch is read again later
            owner = self.owners.get(p)
            if owner is not None and not owner.handle(msg, now_ms):
                self._hold_input(msg)
        busy = []
        now_s = time.monotonic()
        budget = self.settings.cycle_fire_limit
        # each partition plans its crowds at its share of the process's crowd rate
        crowd_rate = self.policy.crowd_rate_per_s / max(1, len(self.owners))
        for owner in self._fire_order():
            if self.firing and budget > 0 and owner.inputs_read(self.consumer, now_ms):
                fired = owner.fire(now_ms, min(self.settings.fire_limit, budget), crowd_rate)
                budget -= fired
                if budget <= 0:  # the next cycle starts after this partition
                    self._fire_next = owner.partition + 1
            if self._due_for_commit(owner, now_s, now_ms):
                busy.append(owner)
        self._bursting = budget <= 0
        # each partition commits its own transaction; the waits overlap (the client releases
        # the GIL while it waits for the broker), so N busy partitions cost ~one round trip.
        # In threads even for one: a call that never returns must not stop the loop
        if busy:
            self._commit_all(busy)
        self._follow_standby()

    def _prefetch(self, msgs: list[Message]) -> None:
        """Each owner reads the states its inputs of this cycle name (records are keyed by job
        id) in one statement, instead of one read per record: a batch of new jobs' definitions
        found no state one lookup at a time."""
        keys: dict[int, list[str]] = {}
        for msg in msgs:
            key = msg.key()
            if key and msg.error() is None:
                keys.setdefault(msg.partition() or 0, []).append(key.decode("utf-8", "replace"))
        for partition, job_ids in keys.items():
            owner = self.owners.get(partition)
            if owner is not None:
                owner.prefetch(job_ids)

    def _commit_all(self, busy: list[PartitionOwner]) -> None:
        """Commit the busy partitions; one whose transaction calls are still blocked after
        DUETIME_SCHEDULER_COMMIT_STALL_S is given up and started over with a new producer
        (``init_transactions`` fences the stuck one), so one wedged client cannot stop every
        partition of the scheduler.

        A stall starts over the idle partitions too whose producers have not answered since
        the round began: the stall's known cause (a group coordinator cached before a broker
        restart, confluentinc/librdkafka#5456) is in every producer that lived through the
        restart, and each would otherwise stall in a round of its own at its next commit (the
        broker-SIGKILL fault scenario: 20 s, then 22 s more for one partition idle in the
        first round). The busy ones are judged by their own commit of the round only: one that
        returned in time is not started over, even if it sent no input offsets (and so left
        ``proven_at`` where it was)."""
        began = time.monotonic()
        futures = {self._pool.submit(self._commit, owner): owner for owner in busy}
        _, stuck = wait(futures, timeout=self.settings.commit_stall_s)
        if not stuck:
            return
        stalled = [futures[future] for future in stuck]
        for owner in stalled:
            metrics.TXN_ABORTS.labels(reason="stalled").inc()
            log.error(
                "partition %s: its transaction calls did not return within %.0f s: starting "
                "it over with a new producer",
                owner.partition,
                self.settings.commit_stall_s,
                extra={"partition": owner.partition},
            )
        suspects = unproven(self.owners, busy, began)
        for owner in suspects:
            log.warning(
                "partition %s: starting it over with a new producer too: it has not committed "
                "since before the stall, and would likely stall the same way",
                owner.partition,
                extra={"partition": owner.partition},
            )
        for owner in stalled + suspects:  # started over by the loop (_retake_lost)
            owner.abandoned = True  # whatever a blocked call returns, it changes nothing
            self._lost[owner.partition] = owner
        # the stuck calls keep their threads: later cycles get fresh ones
        self._pool.shutdown(wait=False)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="commit")

    def _read_limit(self) -> int:
        return read_limit(self._bursting, self.settings.batch_size, self.settings.cycle_fire_limit)

    def _fire_order(self) -> list[PartitionOwner]:
        return [self.owners[p] for p in fire_order(self.owners, self._fire_next)]

    def _hold_input(self, msg: Message) -> None:
        """Firing is stopped and this record would emit an execution request: read its
        partition again from it once firing resumes (the partition stays paused till then)."""
        tp = TopicPartition(msg.topic() or "", msg.partition() or 0, msg.offset() or 0)
        self.consumer.pause([tp])
        self.consumer.seek(tp)
        self._held_inputs.add((tp.topic, tp.partition))
        log.info(
            "input held until firing resumes: it would emit an execution request",
            extra={"topic": tp.topic, "partition": tp.partition, "offset": tp.offset},
        )

    # --- the clock ------------------------------------------------------------------------

    def _check_clock(self, now_ms: int) -> None:
        """Follow the clock probe's verdict (a lock and some arithmetic: no round trip)."""
        decision = self.probe.decide(now_ms)
        if decision.offset_ms is not None:
            metrics.CLOCK_OFFSET.set(decision.offset_ms / 1000)
        if decision.fire != self.firing:
            self._set_firing(decision)
        if decision.member != self.member:
            self._set_member(decision)

    def _set_firing(self, decision: skew.Decision) -> None:
        self.firing = decision.fire
        metrics.FIRING.set(1 if decision.fire else 0)
        for owner in self.owners.values():
            owner.hold_emits = not decision.fire
        if decision.fire:
            log.info("firing: %s", decision.reason, extra=skew.describe(decision))
            held = [TopicPartition(t, p) for t, p in sorted(self._held_inputs)]
            self._held_inputs.clear()
            if held:
                # assigned or not: the client keeps a partition's pause across a rebalance, so
                # one given up while held would stay paused when it comes back
                self.consumer.resume(held)
            return
        # a scheduler that fires on a clock ahead of the broker's runs every job early
        log.warning(
            "not firing (inputs still read, states still committed): %s",
            decision.reason,
            extra=skew.describe(decision),
        )

    def _set_member(self, decision: skew.Decision) -> None:
        self.member = decision.member
        if decision.member:
            self.consumer.subscribe(
                list(self.topics.scheduler_inputs),
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
            log.info("joining the schedulers' group", extra=skew.describe(decision))
            return
        metrics.CLOCK_GIVE_UPS.inc()
        log.warning(
            "giving up my partitions (leaving the schedulers' group) until my clock is good: %s",
            decision.reason,
            extra=skew.describe(decision),
        )
        # as at shutdown: commit and release every partition, then close the consumer, whose
        # LeaveGroup moves the partitions at once. (Leaving by unsubscribe, or by a close whose
        # revocation committed the pending work, twice left the other scheduler stuck in its
        # own revocation's commit, sending offsets to its transaction, for over 90 s.)
        for p in self.restores.pending():
            self.restores.cancel(p)
        self._flush_all()
        for p in list(self.owners):
            self._drop(p)
        self.consumer.close()
        self._held_inputs.clear()  # a new consumer has no paused partitions
        self.consumer = self._group_consumer()
        metrics.OWNED.set(0)

    def _due_for_commit(self, owner: PartitionOwner, now_s: float, now_ms: int) -> bool:
        """Commit now: something someone waits for (requests fired ahead: by half the lead
        before their due time), anything older than the commit interval, or a cycle's worth
        of changed states."""
        pending = owner.pending
        if pending.empty():
            return False
        if pending.since is None:
            pending.since = now_s
        return (
            pending.urgent(now_ms)
            or now_s - pending.since >= self.settings.commit_interval_s
            or len(pending.dirty) >= self.settings.batch_size
        )

    def _commit(self, owner: PartitionOwner) -> None:
        p = owner.partition
        try:
            owner.commit(self.consumer, self.clock.now_ms())
        except PartitionLost as exc:
            if owner.abandoned:
                return  # given up while blocked: its partition started over meanwhile
            log.error("lost partition %s: %s", p, exc, extra={"partition": p})
            self._lost[p] = owner
        except Exception:
            if owner.abandoned:
                return
            # a bug or an unexpected client error: the cycle's outcome is unknown, so the
            # partition starts over from its changelog (fencing our own old producer)
            log.exception("partition %s cycle failed: restoring it", p, extra={"partition": p})
            metrics.TXN_ABORTS.labels(reason="unexpected").inc()
            try:
                owner.reset(self.consumer)
            except Exception as exc:
                log.error("partition %s could not be restored: %s", p, exc, extra={"partition": p})
                self._lost[p] = owner

    def _retake_lost(self) -> None:
        """Start over the partitions whose producer was fenced or broke.

        A fenced producer does not always mean that another member owns the partition: the
        broker also fences a producer whose transaction outlived the transaction timeout (a
        network cut across a commit). If the group still assigns the partition here, it gets
        a new producer (``init_transactions`` fences any zombie), its state is restored from
        the changelog and its inputs rewound to the committed offsets; otherwise the member
        it was given to does that. A partition that cannot be taken back after many tries in
        a row ends the process, so the group moves it elsewhere.
        """
        lost, self._lost = self._lost, {}
        assigned = {tp.partition for tp in self.consumer.assignment()}
        for p, failed in sorted(lost.items(), key=lambda item: item[0]):
            if self.owners.get(p) is not failed:
                continue  # released, or taken afresh by a rebalance, meanwhile
            self._drop(p)  # never write with that producer again
            if p not in assigned:
                self._retakes.pop(p, None)
                continue
            try:
                self._take(p, self._make_producer(p))
                self.owners[p].rewind(self.consumer)
                self._retakes.pop(p, None)
                log.info("partition %s started over with a new producer", p, extra={"partition": p})
            except Exception as exc:
                self._drop(p)
                tries = self._retakes[p] = self._retakes.get(p, 0) + 1
                if tries >= 10:
                    raise SystemExit(f"scheduler: cannot take partition {p} back: {exc}") from exc
                log.warning(
                    "partition %s could not start over (%s tries): %s",
                    p,
                    tries,
                    exc,
                    extra={"partition": p},
                )
                self._lost[p] = None
        metrics.OWNED.set(len(self.owners))

    def _housekeeping(self) -> None:
        """Gauges: pending jobs per partition, input lag per topic (from cached watermarks)."""
        for p, owner in self.owners.items():
            metrics.PENDING.labels(partition=str(p)).set(owner.store.pending())
        assignment = self.consumer.assignment()
        lag: dict[str, int] = {}
        for tp in self.consumer.position(assignment):
            high = self.consumer.get_watermark_offsets(tp, cached=True)[1]
            if tp.offset >= 0 and high >= 0:
                lag[tp.topic] = lag.get(tp.topic, 0) + max(0, high - tp.offset)
        for topic, value in lag.items():
            metrics.CONSUMER_LAG.labels(topic=topic).set(value)

    def _poll_timeout_s(self) -> float:
        timeout_s = self.settings.idle_poll_s
        wakes = [w for w in (o.next_wake_ms() for o in self.owners.values()) if w is not None]
        if self.restores.pending():
            timeout_s = min(timeout_s, 0.02)  # a partition restored is installed at once
        if not self.firing:
            wakes = []  # nothing fires: due jobs must not turn the loop into a busy wait
        # requests fired ahead wait for their commit (Pending.commit_by_ms) with the timers
        commits = (o.pending.commit_by_ms for o in self.owners.values())
        wakes += [by for by in commits if by is not None]
        if wakes:
            timeout_s = min(timeout_s, max(0.0, (min(wakes) - self.clock.now_ms()) / 1000))
        waiting = [o.pending.since for o in self.owners.values() if o.pending.since is not None]
        if waiting:  # bookkeeping waiting for the commit interval
            due_s = min(waiting) + self.settings.commit_interval_s - time.monotonic()
            timeout_s = min(timeout_s, max(0.0, due_s))
        return timeout_s

    # --- rebalancing ----------------------------------------------------------------------

    def _new_producer(self, partition: int) -> Producer:
        """A transactional producer for ``partition``, not initialised yet (nothing fenced)."""
        return kafka.transactional_producer(
            self.common,
            f"{self.common.topic_prefix}scheduler.{partition}",
            **{
                # a parked copy of an input record can be larger than librdkafka's default limit
                "message.max.bytes": PRODUCER_MAX_BYTES,
                "transaction.timeout.ms": self.settings.transaction_timeout_ms,
            },
        )

    def _make_producer(self, partition: int) -> Producer:
        """A transactional producer for ``partition``, initialised: the old owner is fenced."""
        producer = self._new_producer(partition)
        kafka.init_transactions(producer, 30)
        return producer

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # an exception must not escape a client callback (it resurfaces mangled from consume):
        # a partition we cannot take ends the process so the group gives it to someone else
        try:
            self._assign(consumer, partitions)
        except Exception as exc:
            log.exception("taking partitions failed")
            self._fatal = f"taking partitions failed: {exc}"

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Start taking every partition whose input topics are now all assigned here: its
        fencing and restore run in a restore thread (restores.py) while the loop goes on
        firing the partitions it owns; the loop installs it when the restore ends.

        Incremental: ``partitions`` are only the ones added, so they are assigned first
        (then ``assignment()`` shows every input held here, earlier ones included). A
        partition with an input still elsewhere is not owned: its inputs assigned so far are
        read by nobody, and read again from the committed offsets once it is installed.
        """
        consumer.incremental_assign(partitions)
        log.info("assigned partitions %s", sorted({tp.partition for tp in partitions}))
        held = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        inputs = self.topics.scheduler_inputs
        busy = set(self.owners) | self.restores.pending()
        for p in sorted({tp.partition for tp in partitions} - busy):
            missing = [t for t in inputs if (t, p) not in held]
            if missing:
                # co-partitioning broken (for now): never fire a partition whose inputs are
                # elsewhere; taken when the rest is assigned here
                log.warning(
                    "partition %s assigned without all its input topics (missing %s): "
                    "not owning it yet",
                    p,
                    missing,
                    extra={"partition": p},
                )
                continue
            # its inputs wait (paused) for the restore: nothing is read before its owner exists
            consumer.pause([TopicPartition(t, p) for t in inputs])
            self.restores.start(p)
        metrics.RESTORING.set(len(self.restores.pending()))

    def _build(self, p: int, reader: Consumer) -> Restored:
        """Fence the previous owner (a new transactional producer, initialised in a fence
        thread) and restore the partition from its changelog with ``reader`` (a restore
        thread's own) meanwhile. Fencing waits for the broker (~0.1 s; seconds when the
        coordinator must first abort a dead owner's open transaction, under load), and the
        changelog as it stands needs no fence to be read: only its end is read after it
        (``PartitionOwner.restore``). Then it looks up the ends of the partition's inputs
        (``PartitionOwner.find_input_highs``), off the loop too."""
        started = time.monotonic()
        producer = self._new_producer(p)
        fencing = self._fences.submit(_fence, producer, started)
        copy = None if self.standby is None else self.standby.take(p)
        owner = self._new_owner(p, producer, copy)
        try:
            n, seconds = owner.restore(reader, fenced=fencing.result, **_from_copy(copy))
            owner.find_input_highs(reader)
        except BaseException:
            wait([fencing])  # never close a producer while its init_transactions runs
            owner.close()
            raise
        return Restored(owner, n, seconds, fencing.result(), _copied(copy, owner))

    def _install_restored(self) -> None:
        """Own the partitions whose restore ended: read their inputs from the committed offsets
        (an input assigned before the rest of its partition's was read by no owner)."""
        for p, result in self.restores.done():
            if isinstance(result, BaseException):
                # a partition we cannot take ends the process: the group gives it to another
                log.error("restoring partition %s failed: %s", p, result, extra={"partition": p})
                self._fatal = f"taking partition {p} failed: {result}"
                continue
            inputs = [TopicPartition(t, p) for t in self.topics.scheduler_inputs]
            try:
                self._install(result)
                self._reread(result.owner, inputs)
            except Exception as exc:
                # a broker that does not answer: start it over on the loop (_retake_lost)
                log.warning("installing partition %s failed: %s", p, exc, extra={"partition": p})
                self._drop(p)
                self._lost[p] = None
            self.consumer.resume(inputs)
        metrics.OWNED.set(len(self.owners))
        metrics.RESTORING.set(len(self.restores.pending()))

    def _reread(self, owner: PartitionOwner, inputs: list[TopicPartition]) -> None:
        """Rewind the inputs of a new owner that something read before it was installed (an
        input assigned before the rest of its partition's, one resumed by the clock guard).
        The others have no position yet and start at the committed offset anyway (and a seek
        before the first fetch fails: "Erroneous state")."""
        read = [tp.topic for tp in self.consumer.position(inputs) if tp.offset >= 0]
        if read:
            owner.rewind(self.consumer, read)

    def _take(self, p: int, producer: Producer) -> None:
        """Own ``p`` now, restored on the loop (a partition started over after a failure)."""
        copy = None if self.standby is None else self.standby.take(p)
        owner = self._new_owner(p, producer, copy)
        n, seconds = owner.restore(**_from_copy(copy))
        self._install(Restored(owner, n, seconds, copied=_copied(copy, owner)))

    def _new_owner(self, p: int, producer: Producer, copy: Copy | None = None) -> PartitionOwner:
        """A partition's owner, on an empty store or on a standby ``copy``'s."""
        state_dir = self.settings.state_dir
        return PartitionOwner(
            p,
            topics=self.topics,
            codec=self.codec,
            producer=producer,
            make_producer=self._make_producer,
            restore_consumer=self._restore_consumer,
            store_path=(
                None if state_dir is None else state_dir / self.common.instance_id / f"p{p}.sqlite"
            ),
            window_ms=int(self.settings.window_s * 1000),
            policy=self.policy,
            rng=self.rng,
            clock=self.clock,
            queue_exists=self.queues.exists,
            store=None if copy is None else copy.store,
        )

    def _install(self, restored: Restored) -> None:
        owner, n, seconds = restored.owner, restored.states, restored.seconds
        p = owner.partition
        owner.hold_emits = not self.firing
        metrics.RESTORE_SECONDS.observe(seconds)
        metrics.PENDING.labels(partition=str(p)).set(owner.store.pending())
        self.owners[p] = owner
        log.info(
            "owning partition %s: restored %s states in %.2f s (fenced in %.2f s)%s",
            p,
            n,
            seconds,
            restored.fence_s,
            "" if restored.copied is None else f" onto a standby copy of {restored.copied}",
            extra={"partition": p},
        )
        if self.on_restored is not None:
            self.on_restored(p, n, seconds)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Stop firing the revoked partitions at once and release them; the others go on.

        Incremental: only the partitions that move are revoked, and they do not come straight
        back, so nothing is kept aside for them. What waited for the commit interval is
        dropped, not committed: a commit here sends offsets to a transaction while the group
        rebalances (under the classic protocol that call twice blocked a revocation for over
        90 s), and the revocation holds the new owner back. The inputs are read again from
        the committed offsets by whoever owns the partition next."""
        for p in sorted({tp.partition for tp in partitions}):
            if self.restores.cancel(p):
                # paused for the restore: a partition's pause outlives its assignment here
                consumer.resume([tp for tp in partitions if tp.partition == p])
            owner = self.owners.pop(p, None)
            if owner is not None:
                owner.discard()
                self._close(owner, p)
        metrics.OWNED.set(len(self.owners))
        metrics.RESTORING.set(len(self.restores.pending()))

    def _flush_all(self) -> None:
        """Commit every owner's pending work before the partitions are released, the commits
        overlapping (as a cycle's do: a leave hands its partitions over after the slowest
        commit, not after their sum). One still blocked after the commit stall limit is left
        behind: its partition's next owner fences it."""
        owners = list(self.owners.values())
        if not owners:
            return
        pool = ThreadPoolExecutor(max_workers=len(owners), thread_name_prefix="final-commit")
        wait(
            [pool.submit(self._flush, owner, self.consumer) for owner in owners],
            timeout=self.settings.commit_stall_s,
        )
        pool.shutdown(wait=False)

    def _flush(self, owner: PartitionOwner, consumer: Consumer) -> bool:
        """Commit an owner's pending work; False when it failed (the owner must then be
        restored from its changelog before it is used again)."""
        if owner.pending.empty():
            return True
        try:
            return owner.commit(consumer, self.clock.now_ms()) is not None
        except Exception as exc:
            log.warning(
                "partition %s: committing before release failed: %s",
                owner.partition,
                exc,
                extra={"partition": owner.partition},
            )
            return False

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Lost (our session expired): another member may own them already. Drop everything."""
        for p in sorted({tp.partition for tp in partitions}):
            if self.restores.cancel(p):
                consumer.resume([tp for tp in partitions if tp.partition == p])
            self._drop(p)
        metrics.OWNED.set(len(self.owners))

    def _drop(self, p: int) -> None:
        owner = self.owners.pop(p, None)
        if owner is not None:
            self._close(owner, p)

    def _close(self, owner: PartitionOwner, p: int) -> None:
        try:
            owner.close()
        except KafkaException as exc:
            log.warning("closing partition %s: %s", p, exc, extra={"partition": p})
        metrics.PENDING.labels(partition=str(p)).set(0)
        log.info("released partition %s", p, extra={"partition": p})


def _from_copy(copy: Copy | None) -> dict[str, Any]:
    """``PartitionOwner.restore``'s arguments for a store that is a standby copy."""
    return {} if copy is None else {"start": copy.next_offset, "shares": copy.shares}


def _copied(copy: Copy | None, owner: PartitionOwner) -> int | None:
    """The records of the standby copy ``owner`` was restored onto (None: it was not)."""
    return None if copy is None or owner.store is not copy.store else copy.records


def _fence(producer: Producer, started: float) -> float:
    """Initialise a new owner's producer (fencing the previous owner's); seconds since
    ``started``."""
    kafka.init_transactions(producer, 30)
    return time.monotonic() - started


def run(settings: SchedulerSettings, clock: Clock | None = None) -> int:
    scheduler = Scheduler(settings, clock)
    signal.signal(signal.SIGTERM, scheduler.stop)
    signal.signal(signal.SIGINT, scheduler.stop)
    started = time.monotonic()
    scheduler.run()
    log.info("ran for %.0f s", time.monotonic() - started)
    return 0
