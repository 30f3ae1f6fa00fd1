"""One execution's path through a worker, from claimed slot to committable offset.

``claim lease → run target (timeout, abort; ``running`` is published once it has run for
``running_event_after_s``) → complete lease (fenced) → publish result → offset done``.
The order is the guarantee:

- the lease is completed *before* the result is published, with the token it was claimed
  with: a worker whose lease was taken over (a zombie after a pause, a partition that moved)
  finds its completion refused and publishes nothing, so the scheduler never counts it;
- the offset becomes committable only after the result is acknowledged: a crash anywhere
  before redelivers the request, and the next worker either claims the expired lease and
  runs the attempt again (a visible second attempt, same idempotency key) or finds it done
  and republishes the recorded result (the crash fell between completion and publication);
- a ``busy`` lease (held by a live worker) is claimed again when it expires; ``stale``
  (a newer attempt exists) and ``done`` requests are committed without running;
- a request whose handling raises unexpectedly (a bug, or a record that decodes but that
  our code or PostgreSQL cannot take) is logged, counted
  (``duetime_worker_handling_errors_total``) and parked on the poison topic with the error;
  its lease is released and its offset moves on: one record never stops or wedges a
  partition, let alone the worker.

The slot is freed as soon as the target returns, so reporting never holds capacity; while
due work waits for a slot, the report waits for the starts (report_gate.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from duetime.core import tracing
from duetime.core.clock import SYSTEM_CLOCK, Clock
from duetime.core.kafka import ErrorClass, classify
from duetime.core.models import Priority, ResultStatus
from duetime.core.poison import Parked, park_record
from duetime.core.records import ExecutionRequest
from duetime.core.redact import escape_control
from duetime.core.topics import DEFAULT_QUEUE
from duetime.schemas.codec import Codec

from . import gate, metrics
from .kafka_io import TP, AsyncProducer
from .leases import LIMITED, Claim, DatabaseUnavailable, LeaseStore, Limits
from .report_gate import ReportGate
from .results import Outcome, cancelled, failure, redacted_traceback, result_record, timed_out
from .targets import Targets, log_fields

log = logging.getLogger("duetime.worker")

LOST = "lost"
HANDED_BACK = "handed_back"
CANCELLED = "cancelled"


@dataclass(eq=False)
class Delivery:
    """A fetched record's place in the buffer: its offset is committable once it is handled
    (run and reported, skipped, or parked)."""

    key: str
    tp: TP
    offset: int
    priority: Priority


@dataclass(eq=False)
class Item(Delivery):
    """A fetched execution request and where it came from."""

    request: ExecutionRequest
    msg: Message
    """The record itself: parked as it is if handling it fails."""
    enqueued_at: float = 0.0
    token: int | None = None
    task: asyncio.Task[None] | None = None
    in_target: bool = False
    """True while the task is suspended inside the target (the only place it is cancelled)."""
    abort_reason: str | None = None
    """LOST, HANDED_BACK or CANCELLED when the run was stopped early."""
    stop_flag: threading.Event | None = None
    """A Python task's ``ctx.cancelled``: set whenever the run is stopped early. Made when the
    run starts: a request held for its due time (tens of thousands in a burst) has none."""
    early_seen: bool = False
    """Its early arrival was counted and logged (once per delivery, however long it waits)."""
    queue: str = DEFAULT_QUEUE
    """The queue of the topic it came from (the metrics' ``queue`` label)."""
    limits: Limits | None = None
    """Its job's limits per key, resolved (``limits.resolve``); None: none, or they failed."""
    limit_error: str | None = None
    """Why its limits' keys do not resolve: the attempt fails with it, not retried."""
    limited_since: float | None = None
    """When a limit first held it back (monotonic): the wait-time metric."""
    limit_pass: bool = False
    """Let go by the limit waits to try its claim (it does not join them again first)."""
    trace: str | None = None
    """The request's ``traceparent`` (read at the claim; core/tracing.py)."""
    ahead: asyncio.Future[Claim | None] | None = None
    """Its lease claim, made while it waits for its due time (``Executor.claim_ahead``)."""

    @property
    def execution_id(self) -> str:
        return self.request.execution_id

    def fields(self) -> dict[str, Any]:
        return log_fields(self.request)


_REFUSED_RECORD = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
    }
)


class ResultRefused(Exception):
    """The broker will never accept this result record (the request is parked)."""


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # a cancelled run's late error is expected: do not warn about it


class Executor:
    def __init__(
        self,
        *,
        worker_id: str,
        codec: Codec,
        leases: LeaseStore,
        targets: Targets,
        producer: AsyncProducer,
        results_topic: str,
        poison_topic: str,
        on_slot_free: Callable[[Item], None],
        on_finished: Callable[[Delivery, bool], None],
        on_lease_wait: Callable[[Item, float], None],
        on_fatal: Callable[[BaseException], None],
        running_event_after_s: float = 0.0,
        clock: Clock = SYSTEM_CLOCK,
        on_limit_answer: Callable[[Item, Claim], None] | None = None,
        on_limit_freed: Callable[[Item], None] | None = None,
        report_defer_s: float = 0.0,
    ) -> None:
        self.worker_id = worker_id
        self.clock = clock
        self.codec = codec
        self.leases = leases
        self.targets = targets
        self.producer = producer
        self.results_topic = results_topic
        self.poison_topic = poison_topic
        self._on_slot_free = on_slot_free
        self._on_finished = on_finished
        self._on_lease_wait = on_lease_wait
        self._on_fatal = on_fatal
        self._on_limit_answer = on_limit_answer
        self._on_limit_freed = on_limit_freed
        self.running_event_after_s = running_event_after_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = 0
        self._held: dict[str, Item] = {}
        self._ahead: dict[str, Item] = {}
        """Requests waiting for their due time with a lease claimed ahead: renewed with the
        held ones, so a wait longer than the TTL (a crowd fired seconds ahead) keeps its lease."""
        self._stopping = False
        self.reports = ReportGate(report_defer_s)
        """Finished runs' reports wait here while due work waits for a slot."""
        self._reporting: Counter[Priority] = Counter()
        # labelled children resolved once: labels() costs more than the observation itself
        self._children: dict[tuple[int, str, Priority], Any] = {}
        self._finished_children: dict[tuple[str, Priority, ResultStatus, str], Any] = {}

    def _child(self, metric: Any, item: Item) -> Any:
        """``metric``'s child for the item's queue and priority, resolved once (labels()
        costs more than the observation itself)."""
        key = (id(metric), item.queue, item.priority)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(
                queue=item.queue, priority=item.priority.value
            )
        return child

    def _finished_child(self, item: Item, outcome: Outcome) -> Any:
        """``FINISHED``'s child for the item's queue and priority and the outcome's status and
        reason (our own few values), resolved once."""
        key = (item.queue, item.priority, outcome.status, outcome.reason)
        child = self._finished_children.get(key)
        if child is None:
            child = self._finished_children[key] = metrics.FINISHED.labels(
                queue=item.queue,
                priority=item.priority.value,
                status=outcome.status.value,
                reason=outcome.reason,
            )
        return child

    # --- what the worker asks -------------------------------------------------------------

    def start(self, item: Item) -> None:
        """Run ``item`` in a task; the caller has already taken its slot."""
        self._running += 1
        item.task = self._spawn(self._execute(item), item.key)

    def claim_ahead(self, item: Item) -> None:
        """Claim ``item``'s lease now, while it waits for its due time (the scheduler's fire
        lead): the claims of the requests fetched together share a round trip, and at its due
        time it starts without one. Not for a request with limits (its slot or token is
        taken at the start), nor twice."""
        if item.limits is None and item.ahead is None:
            item.ahead = asyncio.ensure_future(self._claim(item))
            self._ahead[item.execution_id] = item

    def forget_ahead(self, item: Item) -> None:
        """``item`` will not start here (its partition went, the worker stops): give back the
        lease claimed ahead for it, so its next owner need not wait for the TTL."""
        ahead, item.ahead = item.ahead, None
        self._drop_ahead(item)
        if ahead is not None:
            self._spawn(self._release_ahead(item, ahead), item.key)

    def _drop_ahead(self, item: Item) -> None:
        if self._ahead.get(item.execution_id) is item:
            del self._ahead[item.execution_id]

    async def _release_ahead(self, item: Item, ahead: asyncio.Future[Claim | None]) -> None:
        try:
            claim = await ahead
            if claim is not None and claim.token is not None:
                await self.leases.release([(item.execution_id, claim.token)])
        except Exception as exc:  # the lease then expires after its TTL
            log.warning("releasing a lease claimed ahead failed: %s", exc, extra=item.fields())

    def running_count(self) -> int:
        return self._running

    def reporting_count(self, priority: Priority | None = None) -> int:
        """Runs finished and not reported yet (their lease completion and result): out of the
        slots, still in the buffer. ``priority``: of that priority only."""
        if priority is None:
            return self._reporting.total()
        return self._reporting[priority]

    def starts_waiting(self, waiting: bool) -> None:
        """Whether due work waits for a slot now: while it does, finished runs' reports wait
        for the starts (report_gate.py, DUETIME_WORKER_REPORT_DEFER_S)."""
        self.reports.starts_waiting(waiting and not self._stopping)

    def held(self) -> list[tuple[str, int]]:
        """(execution_id, token) of every lease held now (to renew): those of running attempts
        and those claimed ahead for requests still waiting for their due time."""
        held = [(e, i.token) for e, i in self._held.items() if i.token is not None]
        for execution_id, item in self._ahead.items():
            claim = _claimed(item.ahead)
            if claim is not None and execution_id not in self._held:
                held.append((execution_id, claim))
        return held

    def lose(self, execution_id: str, token: int) -> None:
        """The lease ``token`` was taken over: stop its run; its result will not be reported.

        The token matters: by the time a renewal answers, that attempt may have finished and
        a newer one of the same execution may hold the lease."""
        item = self._held.get(execution_id)
        if item is not None and item.token == token:
            self._abort(item, LOST)
            return
        item = self._ahead.get(execution_id)
        if item is not None and _claimed(item.ahead) == token:
            # taken over while it waited (its lease expired): its start claims again, and
            # meets the new holder as any claim would
            item.ahead = None
            self._drop_ahead(item)
            log.warning(
                "a lease claimed ahead was taken over before its start", extra=item.fields()
            )

    def cancel(self, execution_id: str, token: int) -> None:
        """A cancel was requested on the lease ``token``: stop its run; it is reported
        ``cancelled`` (not retryable). Before or after the target runs there is nothing to
        stop: the claim sees the flag first, or the outcome is already being reported."""
        ahead = self._ahead.get(execution_id)
        if ahead is not None and ahead.ahead is not None and _claimed(ahead.ahead) == token:
            # not started yet: its start sees the flag, as a claim after the cancel would
            claim = ahead.ahead.result()
            assert claim is not None  # it answered with a token
            flagged: asyncio.Future[Claim | None] = asyncio.get_running_loop().create_future()
            flagged.set_result(replace(claim, cancelled=True))
            ahead.ahead = flagged
            return
        item = self._held.get(execution_id)
        if item is not None and item.token == token and self._abort(item, CANCELLED):
            metrics.CANCELLED.labels(stage="running").inc()
            log.info("cancel requested: stopping the attempt", extra=item.fields())

    async def abort_all(self, reason: str) -> int:
        """Stop every running target, release its lease; returns how many were stopped."""
        self._stopping = True
        self.starts_waiting(False)  # finished runs report now
        stopped = [i for i in self._held.values() if self._abort(i, HANDED_BACK)]
        for item in stopped:
            log.info("handing back: %s", reason, extra=item.fields())
        held = [(i.execution_id, i.token) for i in stopped if i.token is not None]
        try:
            await self.leases.release(held)
        except Exception as exc:  # the leases then expire after their TTL
            log.warning("releasing %s leases failed: %s", len(held), exc)
        return len(stopped)

    async def drain(self, timeout_s: float) -> None:
        """Wait for the executions still reporting (completing, publishing)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    def park_poison(self, msg: Message, tp: TP, offset: int, error: str) -> None:
        """Copy a request we cannot handle (undecodable, refused by our checks, or whose
        handling failed) to the poison topic; then its offset is done."""
        metrics.POISON.labels(topic=tp[0]).inc()
        parked = park_record(
            topic=tp[0],
            partition=tp[1],
            offset=offset,
            key=msg.key(),
            value=msg.value(),
            headers=msg.headers(),
            error=error,
            role="worker",
            logger=log,
        )
        delivery = Delivery(
            key=f"poison/{tp}/{offset}", tp=tp, offset=offset, priority=Priority.LOW
        )
        self._spawn(self._park(delivery, parked), delivery.key)

    def _abort(self, item: Item, reason: str) -> bool:
        """Cancel ``item``'s task if it is inside its target; True when it was."""
        if not item.in_target or item.abort_reason is not None or item.task is None:
            return False
        item.abort_reason = reason
        if item.stop_flag is not None:
            item.stop_flag.set()  # a sync task in its thread sees ctx.cancelled
        item.task.cancel()
        return True

    # --- one execution --------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _execute(self, item: Item) -> None:
        slot = [True]

        def free_slot() -> None:
            if slot[0]:
                slot[0] = False
                self._running -= 1
                self._on_slot_free(item)

        try:
            ahead, item.ahead = item.ahead, None
            self._drop_ahead(item)
            claim = await (ahead if ahead is not None else self._claim(item))
            if claim is not None and item.limits is not None and self._on_limit_answer:
                self._on_limit_answer(item, claim)  # limits.py: wait, or let the next try
            if claim is None or claim.token is None:
                free_slot()
                if claim is not None:
                    await self._conflict(item, claim)
                return
            token = item.token = claim.token
            self._held[item.execution_id] = item
            if item.limit_error is not None:  # its limit keys do not resolve: fail, not run
                now_ms = self.clock.now_ms()
                free_slot()
                refused = failure("LimitKeyError", item.limit_error, retryable=False)
                await self._report(item, token, refused, now_ms, now_ms)
                return
            if claim.cancelled:  # cancelled before this attempt ran: report, do not run
                metrics.CANCELLED.labels(stage="claimed").inc()
                now_ms = self.clock.now_ms()
                free_slot()
                await self._report(item, token, cancelled("before it started"), now_ms, now_ms)
                return
            now_ms = self.clock.now_ms()
            if gate.expired(item.request, now_ms):  # stale work is dropped, not run late
                free_slot()
                await self._report(item, token, self._expire(item, now_ms), now_ms, now_ms)
                return
            outcome, started_ms, finished_ms = await self._run(item, token)
            free_slot()
            if outcome is None:
                self._release_hold(item)
                if item.abort_reason == LOST:
                    self._lost(item, "while running")
                else:
                    self._on_finished(item, False)
                return
            self._reporting[item.priority] += 1
            try:
                await self.reports.turn()
                await self._report(item, token, outcome, started_ms, finished_ms)
            finally:
                self._reporting[item.priority] -= 1
        except Exception as exc:
            free_slot()
            await self._give_up(item, exc)
        finally:
            free_slot()

    def _expire(self, item: Item, now_ms: int) -> Outcome:
        metrics.EXPIRED.labels(queue=item.queue, priority=item.priority.value).inc()
        outcome = gate.expired_outcome(item.request, now_ms)
        log.info(
            "not starting the attempt: %.3f s past its start window of %g s",
            gate.late_ms(item.request, now_ms) / 1000,
            item.request.start_within_s,
            extra=item.fields(),
        )
        return outcome

    async def _give_up(self, item: Item, exc: Exception) -> None:
        """Handling ``item`` raised: log, count, release its lease, park the request."""
        metrics.HANDLING_ERRORS.labels(stage="execute").inc()
        log.error(
            "handling an execution request failed; parking it on the poison topic: %s",
            redacted_traceback(exc),
            extra=item.fields(),
        )
        token = item.token
        self._release_hold(item)
        try:
            if token is not None:
                await self.leases.release([(item.execution_id, token)])
        except Exception as release_exc:  # the lease then expires after its TTL
            log.warning("releasing the lease failed: %s", release_exc, extra=item.fields())
        self._on_finished(item, False)  # out of the buffer; the parked copy moves the offset
        if self._stopping:
            return  # not committed: redelivered to the partition's next owner
        self.park_poison(item.msg, item.tp, item.offset, f"{type(exc).__name__}: {exc}")

    @tracing.traced("claim", first=True)
    async def _claim(self, item: Item) -> Claim | None:
        try:
            request = item.request
            return await self.leases.claim(
                item.execution_id,
                request.attempt,
                request.job_id,
                request.dag_run_id,
                limits=item.limits,
            )
        except DatabaseUnavailable as exc:  # the worker is stopping while PostgreSQL is away
            log.warning("no lease: %s", exc, extra=item.fields())
            self._on_finished(item, False)
            return None

    @tracing.traced("run")  # an HTTP target's request carries the run's traceparent
    async def _run(self, item: Item, token: int) -> tuple[Outcome | None, int, int]:
        request = item.request
        started_ms = self.clock.now_ms()
        self._child(metrics.START_LATENESS, item).observe(
            max(0, started_ms - request.due_at_ms) / 1000
        )
        self._child(metrics.STARTED, item).inc()
        running_event: asyncio.TimerHandle | None = None
        if self.running_event_after_s <= 0:
            self._send_running(item, token, started_ms)
        else:  # a job done sooner reports its outcome only: half the results traffic
            running_event = asyncio.get_running_loop().call_later(
                self.running_event_after_s, self._send_running, item, token, started_ms
            )
        item.abort_reason = None
        timeout_s = request.timeout_s
        outcome: Outcome | None
        stop_flag = item.stop_flag = threading.Event()
        item.in_target = True
        try:
            async with asyncio.timeout(timeout_s):
                outcome = await self.targets.run(request, stop_flag)
        except TimeoutError:
            stop_flag.set()
            log.info("attempt timed out after %.3g s", timeout_s, extra=item.fields())
            outcome = timed_out(timeout_s)
        except asyncio.CancelledError:
            stop_flag.set()
            if item.abort_reason is None:
                raise  # the worker itself is being torn down
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # our own abort: carry on with the bookkeeping
            # a cancel is reported (not retryable); a lost lease or a hand-back is not
            outcome = cancelled("while running") if item.abort_reason == CANCELLED else None
        finally:
            item.in_target = False
            if running_event is not None:
                running_event.cancel()
        finished_ms = self.clock.now_ms()
        self._child(metrics.DURATION, item).observe((finished_ms - started_ms) / 1000)
        return outcome, started_ms, finished_ms

    def _send_running(self, item: Item, token: int, started_ms: int) -> None:
        """Publish the attempt's ``running`` event (its delivery is not waited for: the final
        result's is what counts, and the producer keeps the two in order)."""
        record = result_record(
            item.request,
            status=ResultStatus.RUNNING,
            worker_id=self.worker_id,
            token=token,
            started_at_ms=started_ms,
        )
        value = self.codec.dump(record, topic=self.results_topic)
        args = (self.results_topic, value, item.request.job_id)
        try:
            self.producer.send(*args, partition=item.tp[1]).add_done_callback(_retrieve)
        except BufferError:  # the local queue is full: wait for room in a task

            async def later() -> None:
                sent = await self.producer.send_wait(*args, partition=item.tp[1])
                sent.add_done_callback(_retrieve)

            self._spawn(later(), f"running/{item.key}")

    @tracing.traced("report")  # the result carries the report's traceparent
    async def _report(
        self, item: Item, token: int, outcome: Outcome, started_ms: int, finished_ms: int
    ) -> None:
        record = result_record(
            item.request,
            status=outcome.status,
            worker_id=self.worker_id,
            token=token,
            started_at_ms=started_ms,
            finished_at_ms=finished_ms,
            outcome=outcome,
        )
        value = self.codec.dump(record, topic=self.results_topic)
        try:
            completed = await self.leases.complete(
                item.execution_id, token, outcome.status.value, value
            )
        finally:
            self._release_hold(item)
        if not completed:
            self._lost(item, "before its result was reported")
            return
        delivered = await self._publish(item, value)
        if delivered:
            self._finished_child(item, outcome).inc()
            if outcome.error is None:
                if log.isEnabledFor(logging.DEBUG):  # its fields cost more than the line
                    log.debug("attempt succeeded", extra=item.fields())
            else:  # expected failures: info, no traceback (the error is in the result)
                log.info(
                    "attempt failed (%s, %s): %s",
                    outcome.reason,
                    "will be retried by policy" if outcome.error.retryable else "permanent",
                    escape_control(outcome.error.message),  # redacted by failure()
                    extra=item.fields(),
                )
        self._on_finished(item, delivered)

    async def _publish(self, item: Item, value: bytes) -> bool:
        """Publish a result until the broker acknowledges it (False: stopped first)."""
        while True:
            future = await self.producer.send_wait(
                self.results_topic,
                value,
                key=item.request.job_id,
                partition=item.tp[1],
                headers=tracing.kafka_headers(tracing.current()),
            )
            try:
                await future
                return True
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() in _REFUSED_RECORD:
                    # this record will never be accepted (e.g. a request's DAG fields plus
                    # the task's output exceed the topic's limit): retrying would stall the
                    # partition forever; the request is parked instead (see _give_up)
                    raise ResultRefused(f"the broker refused the result: {err.str()}") from exc
                if classify(exc) is ErrorClass.FATAL:
                    # e.g. the idempotent producer lost its sequence: nothing this process
                    # sends can be trusted any more; stop (unreported work is redelivered)
                    self._on_fatal(exc)
                    return False
                if self._stopping:
                    return False
                log.warning("publishing a result failed, retrying: %s", exc, extra=item.fields())
                await asyncio.sleep(1.0)

    async def _park(self, delivery: Delivery, parked: Parked) -> None:
        while True:
            future = await self.producer.send_wait(
                self.poison_topic,
                parked.value,
                key=parked.key,
                partition=parked.partition,
                headers=parked.headers,
            )
            try:
                await future
                self._on_finished(delivery, True)
                return
            except KafkaException as exc:
                if self._stopping:
                    return
                log.warning("parking a poison record failed, retrying: %s", exc)
                await asyncio.sleep(1.0)

    # --- conflicts ------------------------------------------------------------------------

    async def _conflict(self, item: Item, claim: Claim) -> None:
        kind = claim.conflict or "busy"
        if kind == LIMITED:
            if self._on_limit_answer is None:  # nobody keeps limit waits: a plain retry
                self._on_lease_wait(item, max(claim.retry_in_s, 0.25))
            return  # else on_limit_answer parked it, to wait for its slot or token
        metrics.LEASE_CONFLICTS.labels(kind=kind).inc()
        if kind == "busy":
            log.info(
                "lease held by %s: waiting %.2f s",
                claim.owner,
                claim.retry_in_s,
                extra=item.fields(),
            )
            self._on_lease_wait(item, claim.retry_in_s)
            return
        log.info(
            "attempt already %s (lease of %s): not running it again",
            "finished" if kind == "done" else "superseded",
            claim.owner,
            extra=item.fields(),
        )
        if kind == "done" and claim.result is not None:
            metrics.REPUBLISHED.inc()
            self._on_finished(item, await self._publish(item, claim.result))
            return
        self._on_finished(item, True)

    def _lost(self, item: Item, when: str) -> None:
        metrics.LEASES_LOST.inc()
        log.warning(
            "lease lost %s (token %s taken over): result not reported",
            when,
            item.token,
            extra=item.fields(),
        )
        self._on_lease_wait(item, 0.05)

    def _release_hold(self, item: Item) -> None:
        if self._held.get(item.execution_id) is item:
            del self._held[item.execution_id]
            if item.limits is not None and self._on_limit_freed is not None:
                self._on_limit_freed(item)  # its slot is free (completed or handed back)


def _claimed(ahead: asyncio.Future[Claim | None] | None) -> int | None:
    """The token of a claim made ahead, once it answered with one."""
    if ahead is None or not ahead.done() or ahead.cancelled() or ahead.exception() is not None:
        return None
    claim = ahead.result()
    return None if claim is None else claim.token
