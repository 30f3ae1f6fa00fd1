"""The worker role: a consumer-group member that runs execution requests, fenced by leases.

One process runs up to ``concurrency`` executions at once on one asyncio event loop (HTTP
calls and coroutine tasks on the loop, sync tasks in threads). The consumer of the four
execution topics (group ``<prefix>workers``, read_committed) is polled in its own thread
(``kafka_io``); records arrive on the loop in batches and wait in one FIFO queue per
priority until :func:`duetime.core.priority.select_next` picks them (critical first, aging,
reserved critical slots). Then, per execution (``execution.py``): claim the lease → publish
``running`` → run the target under its timeout → complete the lease (fenced) → publish the
result → the offset becomes committable.

Guarantees:

- **At least once.** An offset is committed only when its result (or its poison copy) is
  acknowledged by all in-sync replicas, and only in order per partition (``offsets.py``).
  Anything else is redelivered to the partition's next owner.
- **At most one live attempt per execution; no zombie reports.** See ``leases.py``: a result
  is published only after the fenced completion succeeded.
- **Bounded memory.** At most ``buffer`` fetched records are unfinished: beyond that the
  non-critical topics' partitions are paused; the critical topic keeps flowing (it has its
  own bound), so a backlog never hides critical work.
- **Graceful stop** (SIGTERM/SIGINT): stop fetching, drop what has not started, let running
  executions finish for up to ``shutdown_s``, then cancel the rest and release their leases
  (uncommitted: redelivered), flush the producer, commit, close the consumer (leave the
  group).

The main loop is the checklist of STYLE.md; records, slots freeing up and deliveries drive
the work in between, without polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from duetime.consumers.tasks import TaskRegistry
from duetime.core import kafka
from duetime.core.clock import SYSTEM_CLOCK, Clock
from duetime.core.errors import ConfigError, DecodeError
from duetime.core.models import PRIORITY_ORDER, Priority
from duetime.core.poison import PRODUCER_MAX_BYTES
from duetime.core.priority import FairQueue, Waiting, select_next
from duetime.core.records import ExecutionRequest
from duetime.core.topics import Topics
from duetime.schemas.codec import Codec

from . import gate, limits, metrics
from .execution import Delivery, Executor, Item
from .http_target import HttpCaller, close_session, new_session
from .kafka_io import TP, AsyncProducer, ConsumerThread
from .leases import LIMITED, Claim, LeaseStore
from .offsets import OffsetTracker
from .results import check_request, redacted_traceback
from .settings import WorkerSettings
from .targets import Targets

log = logging.getLogger("duetime.worker")

_HOUSEKEEPING_S = 0.05
_SAME_INSTANT_S = 0.001  # the clock's resolution: waits ending this close start together
_LAG_EVERY_S = 5.0
_PURGE_EVERY_S = 600.0
_GAUGES_EVERY_S = 1.0
"""The gauges count the waiting requests, each a walk of the queues: tens of thousands held
during a burst. At every housekeeping tick (50 ms) that walk was 6.8 % of a worker's py-spy
samples in a 100,000-job burst; a scrape reads them every few seconds at most."""
_RESUME_BELOW = 0.8  # resume paused topics below this share of the buffer (hysteresis)


@dataclass
class _State:
    """Everything the loop tracks about fetched records (touched only on the loop)."""

    queues: dict[Priority, FairQueue] = field(
        default_factory=lambda: {p: FairQueue() for p in PRIORITY_ORDER}
    )
    items: dict[str, Item] = field(default_factory=dict)
    running: dict[Priority, int] = field(default_factory=lambda: dict.fromkeys(PRIORITY_ORDER, 0))
    outstanding: dict[Priority, int] = field(
        default_factory=lambda: dict.fromkeys(PRIORITY_ORDER, 0)
    )
    lease_waits: list[tuple[float, int, str]] = field(default_factory=list)
    holding: dict[str, Priority] = field(default_factory=dict)
    """Items held until their due time (in ``lease_waits``): they count against the hold
    buffer, not the buffer."""
    held: dict[Priority, int] = field(default_factory=lambda: dict.fromkeys(PRIORITY_ORDER, 0))
    """``holding`` per priority."""
    limit_waits: limits.LimitWaits = field(default_factory=limits.LimitWaits)
    assigned: set[TP] = field(default_factory=set)
    paused: set[str] = field(default_factory=set)


class Worker:
    """One worker process's work. Build it on the event loop it will run on: its clients
    (leases, producer, HTTP session, consumer) are built here, bound to that loop, and
    started by :meth:`run`."""

    def __init__(
        self,
        settings: WorkerSettings,
        registry: TaskRegistry | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.settings = settings
        self.common = settings.common
        self.clock = clock
        self.worker_id = self.common.instance_id
        self.topics = Topics(self.common.topic_prefix)
        self.registry = _task_registry(settings, registry)
        self.offsets = OffsetTracker()
        self.state = _State()
        # the worker's queues' topics: each with its priority and its queue (one waiting list
        # per priority across the queues: critical first, aging and the reserved slots work
        # over all the work this worker serves)
        self._priority_of = {
            self.topics.execution(p, q): p for q in settings.queues for p in PRIORITY_ORDER
        }
        self._queue_of = {
            self.topics.execution(p, q): q for q in settings.queues for p in PRIORITY_ORDER
        }
        self._stop = asyncio.Event()
        self._stopping = False
        self._started = False
        self._seq = 0
        self._reserved_critical = settings.reserved_critical  # computed, not a field: once
        self._claim_ahead_s = settings.lease_ttl_s / 2
        """A request held for the scheduler's fire lead, at most this early, claims its lease
        at once (``Executor.claim_ahead``; renewed with the running ones while it waits). Half
        the TTL (5 s by default): a crowd of 50,000 held by one worker takes ~4 s of claims on
        a 2-core box beside the other roles, which a quarter of it (2.5 s) did not leave, so
        the first starts waited for them (bench/README.md, "Starts before reports")."""
        self._wait_timer: asyncio.TimerHandle | None = None
        """Brings the earliest of ``lease_waits`` back on time (``_wait``)."""
        self._tasks: list[asyncio.Task[None]] = []
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "build the Worker inside a coroutine on the event loop that will run it"
            ) from None
        self.exit_code = 0
        self._committed_at = 0.0
        self._gauges_at = 0.0
        self.codec = Codec(registry_url=self.common.schema_registry_url)
        s = settings
        # nothing below connects yet: the pools open and the consumer subscribes in run()
        self.leases = LeaseStore(
            self.common.database_url,
            self.worker_id,
            s.lease_ttl_s,
            pool_size=s.db_pool_size,
            complete_gather_s=s.complete_gather_ms / 1000,
        )
        consumer = self._new_consumer()
        self._http = new_session(s.egress, s.concurrency)
        # acks=all (idempotence implies it; said for the reader): a result counts only once
        # every in-sync replica has it, because its offset is committed right after
        self.producer = AsyncProducer(
            # message.max.bytes: it also parks copies of bad requests, up to ~1 MiB each
            kafka.producer(
                self.common,
                **{
                    "acks": "all",
                    "message.max.bytes": PRODUCER_MAX_BYTES,
                    # results share batches and produce requests (WorkerSettings says why)
                    "linger.ms": s.result_linger_ms,
                },
            ),
            self._loop,
            "worker-results",
        )
        self._target_producer: AsyncProducer | None = None
        """Built on the first kafka target (most workers never have one)."""
        targets = Targets(
            registry=self.registry,
            http=HttpCaller(self._http, s.egress, s.secrets, clock=self.clock),
            kafka_producer=self._kafka_target_producer,
            worker_id=self.worker_id,
            topic_prefix=self.common.topic_prefix,
            kafka_topics=s.kafka_topics,
        )
        self.executor = Executor(
            worker_id=self.worker_id,
            codec=self.codec,
            leases=self.leases,
            targets=targets,
            producer=self.producer,
            results_topic=self.topics.results,
            poison_topic=self.topics.poison,
            on_slot_free=self._slot_freed,
            on_finished=self._finished,
            on_lease_wait=self._lease_wait,
            on_fatal=self._fatal,
            running_event_after_s=s.running_event_after_s,
            clock=clock,
            on_limit_answer=self._limit_answer,
            on_limit_freed=self._limit_freed,
            report_defer_s=s.report_defer_s,
        )
        self.consumer = ConsumerThread(
            consumer,
            list(self._priority_of),
            self._loop,
            on_records=self._on_records,
            on_assigned=self._on_assigned,
            on_revoked=self._on_revoked,
            on_failed=lambda: self._fatal(RuntimeError("the consumer thread stopped")),
            batch_size=min(500, s.buffer),
        )

    def _new_consumer(self) -> Consumer:
        s = self.settings
        tuning: dict[str, Any] = {
            # our own buffer bounds the work in memory; librdkafka's default prefetch
            # (64 MiB per partition) would only hold records back behind paused ones
            "queued.max.messages.kbytes": 4096,
            # librdkafka's default wait (500 ms) for an idle fetch: the broker answers a
            # parked read_committed fetch as soon as a transaction's commit marker lands
            # (Kafka 4.1, measured: a record committed 0.7-1 s into an idle wait arrived
            # alike with 10 and 500 ms, p50 27-50 ms on a loaded box), so a shorter wait buys
            # no start lateness; 10 ms cost the broker ~0.3 core per idle worker in
            # fetches (`./run bench fetch`; bench/README.md, CPU per job)
            "fetch.wait.max.ms": 500,
            "on_commit": self._on_commit,
            # a partition this group never committed: a new pool starts at the end of its
            # topics, not at 7 days of history; what it skips and nobody answers is re-emitted
            # by the scheduler's rescuer (docs/decisions.md)
            "auto.offset.reset": "latest" if s.new_group_start == "end" else "earliest",
        }
        if s.group_protocol == "consumer":
            return kafka.kip848_consumer(self.common, s.group, **tuning)
        return kafka.consumer(
            self.common,
            s.group,
            **tuning,
            **{
                "session.timeout.ms": s.session_timeout_ms,
                # incremental (cooperative) rebalancing: a joining or leaving worker
                # moves only the partitions that change hands
                "partition.assignment.strategy": "cooperative-sticky",
            },
        )

    # --- lifecycle ------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop (idempotent; call on the loop, e.g. from a signal handler)."""
        self._stop.set()

    async def run(self) -> None:
        """Run until :meth:`stop`; then shut down gracefully."""
        await self._start()
        try:
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), _HOUSEKEEPING_S)
                try:
                    self._requeue_due_lease_waits()
                    self._let_limit_waiters_go()
                    self._start_ready()
                    self.executor.reports.let_overdue_go()
                    self._apply_backpressure()
                    if time.monotonic() - self._committed_at >= self.settings.commit_interval_s:
                        self._commit()
                    if time.monotonic() - self._gauges_at >= _GAUGES_EVERY_S:
                        self._gauges_at = time.monotonic()
                        self._report_gauges()
                except Exception:
                    metrics.LOOP_ERRORS.inc()
                    log.exception("worker housekeeping failed; carrying on")
        finally:
            await self._shutdown()

    async def _start(self) -> None:
        s = self.settings
        try:
            await asyncio.to_thread(self._check_queues)  # before the pools and the group
        except ConfigError:
            # the clients built with the worker go with it (the process exits on this error)
            self.producer.close()
            await close_session(self._http)
            raise
        await self.leases.open()
        if s.group_protocol == "consumer":
            await asyncio.to_thread(self._set_group_timing)  # before it joins
        self.consumer.start()
        self._tasks = [
            asyncio.create_task(self._renew_leases(), name="renew-leases"),
            asyncio.create_task(self._report_lag(), name="report-lag"),
            asyncio.create_task(self._purge_leases(), name="purge-leases"),
        ]
        self._started = True
        log.info(
            "worker started: %s slots (%s reserved for critical), buffer %s, lease ttl %.1f s, "
            "%s registered tasks; python modules allowed: %s; kafka topics: %s; "
            "http egress: %s; %s secrets",
            s.concurrency,
            s.reserved_critical,
            s.buffer,
            s.lease_ttl_s,
            len(self.registry),
            ",".join(s.allowed_modules) or "none",
            ",".join(s.kafka_topics) or "any but duetime's and Kafka's own",
            s.egress.describe(),
            len(s.secrets),  # how many, never which values
            extra={"worker_id": self.worker_id},
        )

    def _set_group_timing(self) -> None:
        """The pool's group takes DUETIME_SESSION_TIMEOUT_MS and the heartbeat interval
        (KIP-848: the broker's otherwise). A broker that refuses leaves the group at its own
        values: the worker runs on, hands work over slower after a crash, and says so."""
        s = self.settings
        refused = kafka.set_group_timing(
            self.common, s.group, s.session_timeout_ms, s.heartbeat_interval_ms
        )
        if refused is not None:
            log.warning(
                "the workers' group %s keeps the broker's session timeout and heartbeat "
                "interval (DUETIME_SESSION_TIMEOUT_MS=%s and "
                "DUETIME_WORKER_HEARTBEAT_INTERVAL_MS=%s were refused; a dead worker's queued "
                "work moves slower): %s",
                s.group,
                s.session_timeout_ms,
                s.heartbeat_interval_ms,
                refused,
                extra={"worker_id": self.worker_id},
            )

    def _check_queues(self) -> None:
        """Stop at start, naming them, when a served queue has no topics: subscribed to
        missing topics the worker would sit idle while its jobs are dead-lettered."""
        names = self.consumer.consumer.list_topics(timeout=10).topics
        missing = [
            q for q in self.settings.queues if not set(self.topics.executions_of(q)) <= set(names)
        ]
        if missing:
            raise ConfigError(
                f"DUETIME_WORKER_QUEUES: queue{'s' if len(missing) > 1 else ''} "
                f"{', '.join(missing)} {'have' if len(missing) > 1 else 'has'} no topics "
                f"(create {'them' if len(missing) > 1 else 'it'} with `duetime queues create "
                f"NAME`; `duetime queues list` shows the queues)",
                details={"variable": "DUETIME_WORKER_QUEUES", "missing": missing},
            )
        log.info(
            "serving queues %s (group %s; a partition it never committed starts at its %s)",
            ",".join(self.settings.queues),
            self.settings.group,
            self.settings.new_group_start,
        )

    async def _shutdown(self) -> None:
        if not self._started:
            return
        self._started = False
        self._stopping = True
        log.info("stopping: no new work; %s running", self.executor.running_count())
        self._pause(set(self._priority_of))
        self._drop_queued(lambda item: True)
        self.executor.starts_waiting(False)  # nothing more starts: finished runs report now
        if self._wait_timer is not None:
            self._wait_timer.cancel()
            self._wait_timer = None
        deadline = time.monotonic() + self.settings.shutdown_s
        while self.executor.running_count() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        handed_back = await self.executor.abort_all("worker stopping")
        if handed_back:
            log.warning("handed %s unfinished executions back (leases released)", handed_back)
        await self.executor.drain(timeout_s=10.0)
        log.debug("shutdown: executions drained")
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        remaining = await self.producer.flush(10.0)
        if remaining:
            log.error("%s results not acknowledged at shutdown", remaining)
        self._commit()
        log.debug("shutdown: results flushed, offsets committed")
        await self.consumer.stop()  # the revoke callback commits; then it leaves the group
        log.debug("shutdown: consumer closed")
        for producer in (self.producer, self._target_producer):
            if producer is not None:
                await producer.flush(5.0)
                producer.close()
        await close_session(self._http)
        await self.leases.close()
        self.codec.close()
        log.info("worker stopped")

    def _fatal(self, exc: BaseException) -> None:
        log.error("fatal error, stopping: %s", exc)
        self.exit_code = 1
        self.stop()

    def _kafka_target_producer(self) -> AsyncProducer:
        # a separate producer for users' topics: a failure there must not touch our results
        if self._target_producer is None:
            self._target_producer = AsyncProducer(
                kafka.producer(self.common, **{"acks": "all"}), self._loop, "worker-targets"
            )
        return self._target_producer

    # --- records in -----------------------------------------------------------------------

    def _on_records(self, records: list[Message]) -> None:
        for msg in records:
            self._accept(msg)
        try:
            self._start_ready()
        except Exception:  # the housekeeping loop starts them at its next round
            metrics.LOOP_ERRORS.inc()
            log.exception("starting work failed; carrying on")

    def _accept(self, msg: Message) -> None:
        tp: TP = (msg.topic() or "", msg.partition() or 0)
        offset = msg.offset() or 0
        if self._stopping or tp not in self.state.assigned:
            return  # not tracked, never committed: redelivered to whoever owns it next
        if not self.offsets.add(tp, offset):
            return  # already seen in this assignment
        try:
            priority = self._priority_of[tp[0]]
            request = self.codec.load(
                ExecutionRequest, msg.value() or b"", topic=tp[0], partition=tp[1], offset=offset
            )
            check_request(request)
            gate.check_window(request.start_within_s)
            limits.check_limits(request)
        except (DecodeError, ValueError, KeyError) as exc:
            self.executor.park_poison(msg, tp, offset, f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # anything a hostile record makes our code raise: park it
            metrics.HANDLING_ERRORS.labels(stage="accept").inc()
            log.error(
                "checking an execution request failed; parking it: %s",
                redacted_traceback(exc),
                extra={"topic": tp[0], "partition": tp[1], "offset": offset},
            )
            self.executor.park_poison(msg, tp, offset, f"{type(exc).__name__}: {exc}")
            return
        self._seq += 1  # a key per delivery: a partition can come back while old work runs
        key = f"{tp[0]}/{tp[1]}/{offset}#{self._seq}"
        item = Item(
            key=key,
            tp=tp,
            offset=offset,
            priority=priority,
            request=request,
            msg=msg,
            queue=self._queue_of[tp[0]],
        )
        if request.concurrency is not None or request.rate_limit is not None:
            try:
                item.limits = limits.resolve(request)
            except ValueError as exc:  # reported as the attempt's failure once it is claimed
                item.limit_error = str(exc)
        self.state.items[key] = item
        self.state.outstanding[priority] += 1
        self.state.queues[priority].append(
            Waiting(time.monotonic(), key, request.fairness_key, request.fairness_weight)
        )

    # --- starting work --------------------------------------------------------------------

    def _start_ready(self) -> None:
        if self._stopping:
            return
        s = self.settings
        st = self.state
        while True:
            chosen = select_next(
                st.queues,
                st.running,
                s.concurrency,
                self._reserved_critical,
                s.aging_s,
                time.monotonic(),
            )
            if chosen is None:
                # due work left waiting for a slot: finished runs' reports wait for it
                self.executor.starts_waiting(any(st.queues.values()))
                return
            waiting = st.queues[chosen].popleft()
            item = st.items.get(waiting.key)
            if item is None:
                continue  # dropped meanwhile (revoked partition)
            item.enqueued_at = waiting.enqueued_at
            if self._held_early(item) or self._limit_parked(item):
                continue
            st.running[chosen] += 1
            self.executor.start(item)

    def _held_early(self, item: Item) -> bool:
        """True when ``item`` is not due yet by this worker's clock (issue 14, item 8): it
        waits outside the slots, without a lease, and comes back to the head of its queue at
        its due time; or, further ahead than DUETIME_WORKER_MAX_EARLY_WAIT_S, it is handed back
        to the scheduler's rescuer (its offset moves on, nothing runs, no result: the rescuer
        re-emits the execution after its deadline, or fails the attempt ``lost``)."""
        early_ms = gate.early_ms(item.request, self.clock.now_ms())
        if early_ms <= 0:
            return False
        early_s = early_ms / 1000
        led_ms = gate.led_ms(item.request)
        # early by at most the scheduler's fire lead: on purpose, not worth a line or a count
        first = not item.early_seen and early_ms > led_ms
        item.early_seen = True
        if early_s > self.settings.max_early_wait_s:
            metrics.EARLY.labels(action="handed_back").inc()
            metrics.EARLY_SECONDS.observe(early_s)
            log.warning(
                "execution request %.3f s before its due time by this worker's clock, beyond "
                "DUETIME_WORKER_MAX_EARLY_WAIT_S=%g: not run, left to the scheduler's rescuer "
                "(is a scheduler's clock ahead, or this worker's behind?)",
                early_s,
                self.settings.max_early_wait_s,
                extra=item.fields(),
            )
            self._finished(item, done=True)
            return True
        if early_ms <= led_ms:  # held for the lead: its lease is ready at its time
            if early_s <= self._claim_ahead_s:
                self.executor.claim_ahead(item)
            else:  # back at TTL/2 before it, to claim it then, with the others due with it
                early_s -= self._claim_ahead_s
        if first:
            metrics.EARLY.labels(action="waited").inc()
            metrics.EARLY_SECONDS.observe(early_s)
            log.info(
                "execution request %.3f s before its due time: waiting for it",
                early_s,
                extra=item.fields(),
            )
        self._wait(item, early_s)
        if item.key not in self.state.holding:
            self.state.holding[item.key] = item.priority
            self.state.held[item.priority] += 1
        return True

    def _unhold(self, key: str) -> None:
        priority = self.state.holding.pop(key, None)
        if priority is not None:
            self.state.held[priority] -= 1

    # --- limits per key (limits.py) -------------------------------------------------------

    def _limit_parked(self, item: Item) -> bool:
        """True when ``item``'s key already has waiters: it joins them without a claim."""
        if item.limits is None or item.limit_pass:
            item.limit_pass = False
            return False
        wait_key = self.state.limit_waits.blocking(item.limits)
        if wait_key is None:
            return False
        now = time.monotonic()
        if item.limited_since is None:
            item.limited_since = now
        self.state.limit_waits.park(item.key, wait_key, item.priority, item.enqueued_at, now)
        return True

    def _limit_answer(self, item: Item, claim: Claim) -> None:
        """A limited item's claim answered: wait for the limit that refused it, or let the
        next waiter of its keys try (a limit of N lets N go, one claim after the other)."""
        waits = self.state.limit_waits
        now = time.monotonic()
        assert item.limits is not None
        if claim.conflict == LIMITED:
            reason = claim.waiting or "concurrency"
            metrics.LIMIT_REFUSED.labels(reason=reason).inc()
            if item.limited_since is None:
                item.limited_since = now
            if item.tp not in self.state.assigned or self._stopping:
                self._finished(item, done=False)  # its partition moved: redelivered there
                return
            wait_key = next(
                (k for k in limits.wait_keys(item.limits) if limits.reason_of(k) == reason),
                limits.wait_keys(item.limits)[0],
            )
            waits.park(item.key, wait_key, item.priority, item.enqueued_at, now, claim.retry_in_s)
            return
        for wait_key in limits.wait_keys(item.limits):
            waits.wake(wait_key, now)
        if claim.token is not None and item.limited_since is not None:
            metrics.LIMIT_WAIT_SECONDS.observe(now - item.limited_since)
            item.limited_since = None

    def _limit_freed(self, item: Item) -> None:
        """A limited execution ended here: its concurrency slot is free (wake its waiters)."""
        if item.limits is not None and item.limits.concurrency_key is not None:
            self.state.limit_waits.wake("c:" + item.limits.concurrency_key, time.monotonic())

    def _let_limit_waiters_go(self) -> None:
        for key in self.state.limit_waits.due(time.monotonic()):
            item = self.state.items.get(key)
            if item is not None:  # back to the head of its queue, keeping its age
                item.limit_pass = True
                self.state.queues[item.priority].appendleft(Waiting(item.enqueued_at, key))

    def _slot_freed(self, item: Item) -> None:
        self.state.running[item.priority] -= 1
        self._start_ready()

    def _finished(self, item: Delivery, done: bool) -> None:
        """The item leaves the buffer; ``done``: its offset may be committed."""
        if isinstance(item, Item) and item.ahead is not None:
            self.executor.forget_ahead(item)  # dropped before its start: its lease goes back
        if self.state.items.pop(item.key, None) is not None:
            self.state.outstanding[item.priority] -= 1
            self._unhold(item.key)
        if done:
            self.offsets.done(item.tp, item.offset)

    def _lease_wait(self, item: Item, delay_s: float) -> None:
        """Try to claim ``item`` again in ``delay_s`` (its lease is held elsewhere)."""
        if item.tp not in self.state.assigned or self._stopping:
            self._finished(item, done=False)
            return
        self._wait(item, delay_s)

    def _wait(self, item: Item, delay_s: float) -> None:
        """Put ``item`` aside for ``delay_s``; a timer brings it back on time (a request held
        until its due time starts within a millisecond or so of it, not at the next
        housekeeping round)."""
        self._seq += 1
        heapq.heappush(self.state.lease_waits, (time.monotonic() + delay_s, self._seq, item.key))
        self._arm_wait_timer()

    def _arm_wait_timer(self) -> None:
        """One timer, for the earliest of ``lease_waits`` (moved earlier when needed; the
        event loop's clock is time.monotonic())."""
        waits = self.state.lease_waits
        if not waits or self._stopping:
            return
        at = waits[0][0]
        timer = self._wait_timer
        if timer is not None:
            if timer.when() <= at:
                return
            timer.cancel()
        self._wait_timer = self._loop.call_at(at, self._wait_over)

    def _wait_over(self) -> None:
        self._wait_timer = None
        try:
            self._requeue_due_lease_waits()
            self._start_ready()  # may hold more requests: _wait arms the timer for them
        except Exception:  # the housekeeping loop starts them at its next round
            metrics.LOOP_ERRORS.inc()
            log.exception("starting work failed; carrying on")
        self._arm_wait_timer()

    def _requeue_due_lease_waits(self) -> None:
        """Put the waits that are over back at the head of their queues, with those ending
        within the next millisecond whose request is due by the clock: a wait's end is
        reckoned from the clock's whole milliseconds, so requests due at one instant end their
        waits up to a millisecond apart, and they start in one round instead of one each."""
        now = time.monotonic()
        now_ms: int | None = None
        waits = self.state.lease_waits
        while waits and waits[0][0] <= now + _SAME_INSTANT_S:
            if waits[0][0] > now:
                item = self.state.items.get(waits[0][2])
                if now_ms is None:
                    now_ms = self.clock.now_ms()
                if item is not None and gate.early_ms(item.request, now_ms) > 0:
                    break  # not due yet by the clock: its own timer brings it back
            _, _, key = heapq.heappop(waits)
            self._unhold(key)
            item = self.state.items.get(key)
            if item is not None:  # back to the head of its queue, keeping its age
                self.state.queues[item.priority].appendleft(Waiting(item.enqueued_at, key))

    # --- flow control and commits ---------------------------------------------------------

    def _apply_backpressure(self) -> None:
        """Pause fetching beyond the buffer (or the hold buffer: requests held until their due
        time count apart, so a burst fired ahead keeps being fetched); the critical topic has
        bounds of its own."""
        st = self.state
        held = sum(st.held.values())
        # run and reporting (their reports may wait for the starts): no slot, only memory,
        # bounded apart, by what the two buffers let in at once
        reporting = self.executor.reporting_count()
        total = sum(st.outstanding.values()) - held - reporting
        critical = {t for t, p in self._priority_of.items() if p is Priority.CRITICAL}
        others = set(self._priority_of) - critical
        full = self._full(total, held, reporting)
        if full is True:
            self._pause(others)
        elif full is False:
            self._resume(others)
        held_critical = st.held[Priority.CRITICAL]
        reporting_critical = self.executor.reporting_count(Priority.CRITICAL)
        full = self._full(
            st.outstanding[Priority.CRITICAL] - held_critical - reporting_critical,
            held_critical,
            reporting_critical,
        )
        if full is True:
            self._pause(critical)
        elif full is False:
            self._resume(critical)

    def _full(self, waiting: int, held: int, reporting: int) -> bool | None:
        """True: pause (a buffer full); False: resume (all under their hysteresis mark);
        None: as it is. Runs reporting may be as many as both buffers hold."""
        buffer, hold_buffer = self.settings.buffer, self.settings.hold_buffer
        if waiting >= buffer or held >= hold_buffer or reporting >= buffer + hold_buffer:
            return True
        if (
            waiting < buffer * _RESUME_BELOW
            and held < hold_buffer * _RESUME_BELOW
            and reporting < (buffer + hold_buffer) * _RESUME_BELOW
        ):
            return False
        return None

    def _pause(self, topics: set[str]) -> None:
        new = topics - self.state.paused
        if new:
            self.state.paused |= new
            self._set_paused([tp for tp in self.state.assigned if tp[0] in new], True)

    def _resume(self, topics: set[str]) -> None:
        back = topics & self.state.paused
        if back and not self._stopping:
            self.state.paused -= back
            self._set_paused([tp for tp in self.state.assigned if tp[0] in back], False)

    def _set_paused(self, tps: list[TP], paused: bool) -> None:
        if not tps:
            return
        consumer = self.consumer.consumer
        parts = [TopicPartition(t, p) for t, p in tps]
        self.consumer.call(lambda: consumer.pause(parts) if paused else consumer.resume(parts))

    def _commit(self) -> None:
        self._committed_at = time.monotonic()
        offsets = self.offsets.to_commit()
        if not offsets:
            return
        consumer = self.consumer.consumer
        parts = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]

        def commit() -> None:
            try:
                consumer.commit(offsets=parts, asynchronous=True)
            except KafkaException as exc:
                # e.g. a rebalance in progress: the revocation commits synchronously anyway
                log.debug("commit failed: %s", exc)
                self._on_commit(exc, parts)

        self.consumer.call(commit)

    def _on_commit(self, err: Any, partitions: list[TopicPartition]) -> None:
        """Commit report (poll thread): a failed commit is retried at the next round."""
        failed = [(tp.topic, tp.partition) for tp in partitions if err or tp.error]
        if failed:
            self._loop.call_soon_threadsafe(self.offsets.uncommitted, failed)

    # --- rebalancing (called on the loop) -------------------------------------------------

    def _on_assigned(self, tps: list[TP]) -> None:
        """Each new partition takes its topic's flow state, both ways: librdkafka keeps a
        partition's pause flag across a revocation and a new assignment, so one paused when it
        was revoked, and given back after its topic was resumed (which reaches only the
        partitions assigned then), would otherwise never be fetched again (the limits fault
        scenario at full size: a worker's partition stalled for good, 530 jobs with it)."""
        self.state.assigned.update(tps)
        paused = [tp for tp in tps if tp[0] in self.state.paused]
        self._set_paused(paused, True)
        self._set_paused([tp for tp in tps if tp[0] not in self.state.paused], False)
        log.info("assigned %s partitions (now %s)", len(tps), len(self.state.assigned))
        if tps:
            self._tasks.append(asyncio.create_task(self._log_new_partitions(tps)))

    async def _log_new_partitions(self, tps: list[TP]) -> None:
        """Say where partitions the group never committed start (``new_group_start``)."""
        consumer = self.consumer.consumer
        try:
            committed = await self.consumer.ask(
                lambda: consumer.committed([TopicPartition(*tp) for tp in tps], timeout=10)
            )
        except Exception as exc:  # only this log line is lost
            log.debug("reading the committed offsets failed: %s", exc)
            return
        fresh = sorted(f"{tp.topic}[{tp.partition}]" for tp in committed if tp.offset < 0)
        if fresh:
            log.info(
                "group %s has no committed offset for %s partitions (%s): they start at the "
                "%s of their topics%s",
                self.settings.group,
                len(fresh),
                ", ".join(fresh[:12]) + (" ..." if len(fresh) > 12 else ""),
                self.settings.new_group_start,
                ", not at their history: an earlier request nobody answered is re-emitted by "
                "the scheduler's rescuer"
                if self.settings.new_group_start == "end"
                else "",
            )

    async def _on_revoked(self, tps: list[TP], lost: bool) -> dict[TP, int]:
        gone = set(tps)
        positions = self.offsets.positions(list(gone))
        for tp in gone:
            self.offsets.forget(tp)
        self.state.assigned -= gone
        self._drop_queued(lambda item: item.tp in gone)
        # finished runs of those partitions report now: the new owner, redelivered their
        # requests, meets their leases held until then (the next round looks at starts again)
        self.executor.starts_waiting(False)
        log.info(
            "%s %s partitions (now %s)",
            "lost" if lost else "revoked",
            len(gone),
            len(self.state.assigned),
        )
        return positions

    def _drop_queued(self, which: Callable[[Item], bool]) -> None:
        """Forget queued (not started) items matching ``which``; their owner redelivers them."""
        st = self.state
        for priority, queue in st.queues.items():
            keep = FairQueue()  # the keys' turns start afresh: a rebalance is rare
            for waiting in queue:
                item = st.items.get(waiting.key)
                if item is None:
                    continue
                if which(item):
                    self._finished(item, done=False)
                else:
                    keep.append(waiting)
            st.queues[priority] = keep
        waits = []
        for entry in st.lease_waits:
            item = st.items.get(entry[2])
            if item is None:
                continue
            if which(item):
                self._finished(item, done=False)
            else:
                waits.append(entry)
        heapq.heapify(waits)
        st.lease_waits = waits
        for key in st.limit_waits.drop(lambda key: key in st.items and which(st.items[key])):
            self._finished(st.items[key], done=False)

    # --- beside the loop ------------------------------------------------------------------

    async def _renew_leases(self) -> None:
        while True:
            await asyncio.sleep(self.settings.renew_interval_s)
            held = self.executor.held()
            if not held:
                continue
            try:
                renewal = await self.leases.renew_checked(held)
            except Exception as exc:
                log.warning("lease renewal failed: %s", exc)
                continue
            for execution_id, token in held:
                if execution_id in renewal.lost:
                    self.executor.lose(execution_id, token)
                elif execution_id in renewal.cancelled:
                    self.executor.cancel(execution_id, token)

    async def _report_lag(self) -> None:
        while True:
            await asyncio.sleep(_LAG_EVERY_S)
            try:
                await self._measure_lag()
            except Exception as exc:
                log.debug("lag measurement failed: %s", exc)

    async def _measure_lag(self) -> None:
        consumer = self.consumer.consumer
        tps = list(self.state.assigned)

        def ends_and_positions() -> list[tuple[int, int]]:
            parts = [TopicPartition(*tp) for tp in tps]
            fetched = consumer.position(parts) if parts else []
            ends = [consumer.get_watermark_offsets(p, cached=True)[1] for p in parts]
            return [(end, f.offset) for end, f in zip(ends, fetched, strict=True)]

        answers = await self.consumer.ask(ends_and_positions)
        lag = dict.fromkeys(self._priority_of, 0)
        for tp, (end, fetched) in zip(tps, answers, strict=True):
            # what is not finished yet: from the oldest pending record (or the fetch position,
            # which also steps over transaction markers) to the end of the partition
            pending = self.offsets.first_pending(tp)
            position = fetched if pending is None else pending
            if end >= 0 and position >= 0:
                lag[tp[0]] += max(0, end - position)
        for topic, value in lag.items():
            metrics.CONSUMER_LAG.labels(topic=topic).set(value)

    async def _purge_leases(self) -> None:
        while True:
            await asyncio.sleep(_PURGE_EVERY_S * (0.5 + random.random()))
            try:
                purged = await self.leases.purge(self.settings.lease_retention_s)
                if purged:
                    log.info("purged %s finished leases", purged, extra={"count": purged})
            except Exception as exc:
                log.warning("purging old leases failed: %s", exc)

    def _report_gauges(self) -> None:
        st = self.state
        metrics.INFLIGHT.set(sum(st.running.values()))
        metrics.BUFFERED.set(sum(st.outstanding.values()))
        metrics.REPORTING.set(self.executor.reporting_count())
        metrics.REPORTS_WAITING.set(len(self.executor.reports))
        waiting = Counter(
            (st.items[w.key].queue, priority)
            for priority, queue in st.queues.items()
            for w in queue
            if w.key in st.items
        )
        for q in self.settings.queues:
            for priority in PRIORITY_ORDER:
                metrics.QUEUED.labels(queue=q, priority=priority.value).set(waiting[(q, priority)])
        metrics.PAUSED.set(sum(1 for tp in st.assigned if tp[0] in st.paused))
        for reason, count in st.limit_waits.counts().items():
            metrics.LIMIT_WAITING.labels(reason=reason).set(count)


def _task_registry(settings: WorkerSettings, registry: TaskRegistry | None) -> TaskRegistry:
    """The tasks this worker may run: ``registry``'s and those of ``DUETIME_WORKER_IMPORTS``."""
    tasks = TaskRegistry(allowed_modules=settings.allowed_modules)
    if registry is not None:
        tasks.update(registry)
    if settings.imports:
        try:
            tasks.discover(settings.imports)
        except Exception as exc:
            raise ConfigError(
                f"DUETIME_WORKER_IMPORTS: cannot import {', '.join(settings.imports)}: "
                f"{type(exc).__name__}: {exc}",
                details={"variable": "DUETIME_WORKER_IMPORTS"},
            ) from exc
    return tasks


def run(
    settings: WorkerSettings, registry: TaskRegistry | None = None, clock: Clock = SYSTEM_CLOCK
) -> int:
    """The ``duetime worker`` process: run until SIGTERM or SIGINT."""

    async def main() -> int:
        worker = Worker(settings, registry, clock=clock)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()
        return worker.exit_code

    return asyncio.run(main())
