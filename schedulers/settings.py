"""The scheduler role's configuration, built once from the environment in ``main``."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from duetime.core.config import CommonSettings, Env, check_heartbeat
from duetime.core.errors import ConfigError

from .fairness import DEFAULT_INFLIGHT


@dataclass(frozen=True)
class SchedulerSettings:
    common: CommonSettings
    state_dir: Path | None = None
    """Where partition stores live (SQLite files); None keeps them in memory (tests only)."""
    window_s: float = 300.0
    """Jobs waking within this window are indexed in RAM; the rest only on disk."""
    batch_size: int = 2000
    fire_limit: int = 2000
    """At most this many due jobs per partition per cycle: transactions stay short and inputs
    keep flowing during a burst."""
    cycle_fire_limit: int = 1_000_000
    """At most this many due jobs per cycle over all owned partitions (default: no limit but
    ``fire_limit`` per partition). A cycle's requests are visible to workers only once its
    transactions commit, so a lower limit fires and commits a burst in slices: workers start
    on the first slice while the next is fired (10,000 jobs due at once in 12 partitions are
    one ~0.9 s cycle, the second core idle), and while the budget keeps running out a cycle
    reads a fifth of it in input records (``service.read_limit``). Not the default: each
    slice waits for its commits, and on a loaded box (commits of 0.2-0.5 s) 1,000 a cycle
    made the 10,000-job burst slower (951 jobs/s, p99 10.4 s against 1,717 and 5.5 s); on a
    calmer one it cut p50 start lateness by 0.4-0.7 s with the same p99 (bench/README.md)."""
    misfire_threshold_s: float = 5.0
    fairness_inflight: int = DEFAULT_INFLIGHT
    """Executions of one fairness key in flight per partition (times the job's weight) before
    due ones are held (schedulers/fairness.py says why the default is what it is)."""
    catch_up_cap: int = 100
    catch_up_window_s: float = 24 * 3600.0
    session_timeout_ms: int = 3000
    """The schedulers' group session timeout: a member silent this long (SIGKILLed, cut off,
    frozen) loses its partitions. Set on the group (KIP-848: the broker's setting, bounded by
    its ``group.consumer.min/max.session.timeout.ms``). Failover lateness is this plus a
    heartbeat, the fencing and the restore. 2 s (with 250 ms heartbeats) was tried: on the
    loaded 2-core box the coordinator answered heartbeats in over 1 s (librdkafka then times
    the request out), members were fenced and rejoined, and the fault campaign's scheduler
    scenarios never saw a stable group."""
    heartbeat_interval_ms: int = 500
    """The schedulers' group heartbeat interval: a member learns of a partition given to it
    (or taken away) at its next heartbeat, so this bounds the hand-off's wait when a scheduler
    joins or leaves, on top of the session timeout on a failover. The workers' value (the
    local broker's ``group.consumer.heartbeat.interval.ms``)."""
    idle_poll_s: float = 0.05
    commit_interval_s: float = 1.0
    """A partition with only bookkeeping to write (states after definitions and results, no
    execution request, dead letter or command) commits at most this often: each transaction
    costs the broker about ten requests and log appends, and one per input record was most
    of its CPU. Anything someone waits for commits in the cycle that made it; execution
    requests fired ahead of their time (``fire_lead_ms``) by half the lead before it. 1 s
    with the 2 s lead (docs/decisions.md 22): 0.5 s with 1 s cost ~10 % more CPU a job, 0.2 s
    with 500 ms 28 % more than that."""
    fire_lead_ms: int = 2000
    """Scheduled runs and retries are emitted this long before their due time; the worker
    holds each request until its due time (workers never start early), so the transaction,
    the broker's markers and the workers' fetch no longer make runs late. Rescue deadlines
    are not led. A pause or change that reaches the scheduler inside the lead does not stop
    the run already emitted (as one that reaches it after the due time); a cancel does,
    through the projector (docs/decisions.md 25). 0: emit at the due time. 2 s: with 1 s
    bookkeeping commits a partition's fires and results share half the transactions of the
    1 s lead's (docs/decisions.md 22)."""
    crowd_rate: float = 2000.0
    """The crowd lead (schedulers/crowd.py): the jobs a second this process plans to get out
    (fired, committed, fetched and claimed by the workers) ahead of their time. Jobs due closer
    together than that are fired earlier than the fire lead, by the time they take to go out
    at this rate (a burst of N: (N - 1) / rate), so they wait at the workers, claimed, when their
    time comes; a steady load below it gets no extra lead. Each partition plans with its share
    (this divided by the partitions the process owns)."""
    crowd_lead_max_ms: int = 25_000
    """The crowd lead's cap on top of ``fire_lead_ms`` (0: no crowd lead). A pause or change
    that reaches the scheduler inside the lead does not stop the run already emitted;
    the workers hold led requests (within DUETIME_WORKER_MAX_EARLY_WAIT_S, 60 s, and
    DUETIME_WORKER_HOLD_BUFFER of them)."""
    standby: bool = True
    """Follow the partitions other schedulers own in local copies (standby.py), so that one
    given to this scheduler (a failover, a join, a leave) reads only its changelog's tail
    past its copy instead of all of it. Costs each scheduler a read and a SQLite write of
    every other scheduler's changelog records; a lone scheduler follows nothing once it owns
    every partition."""
    standby_warm_s: float = 30.0
    """At start, wait at most this long for the standby's copies to reach the changelog's end
    before joining the group (0: join at once; the copies then catch up meanwhile)."""
    commit_stall_s: float = 20.0
    """A partition's transaction calls that have not returned after this long are given up:
    the partition starts over with a new producer (fencing the stuck one). Its calls carry 10 s
    timeouts (20 s for the two of a commit), but librdkafka 2.16's send_offsets_to_transaction
    can wait forever for a group coordinator it cached before a broker restart
    (confluentinc/librdkafka#5456, #5511):
    seen in the broker-SIGKILL fault scenario, the scheduler stopped firing for good."""
    transaction_timeout_ms: int = 30_000
    """How long the broker lets an open transaction of a silent owner block read_committed
    readers before aborting it (only when nobody takes the partition over: a new owner aborts
    it at once)."""
    lease_ttl_s: float = 10.0
    """The workers' lease TTL: the same variable as theirs (DUETIME_LEASE_TTL_S), read here to
    know how late a dead holder is fenced out (part of every rescue deadline)."""
    rescue_grace_s: float = 30.0
    """Slack on top of a job's timeout and the lease TTL before a missing result is rescued."""
    max_rescues: int = 3
    """Re-emissions of one attempt before it fails with reason ``lost``."""
    lease_retention_s: float = 7 * 24 * 3600.0
    """The workers' finished-lease retention (DUETIME_LEASE_RETENTION_S, the same variable):
    a rescue must meet the finished lease of a run that did end, or the work runs twice."""

    max_clock_skew_s: float = 1.0
    """Fire only while the wall clock is certainly within this of the broker's (skew.py)."""
    clock_give_up_s: float = 30.0
    """Not allowed to fire this long in a row (skewed, or unknown): leave the group so a
    healthy scheduler takes the partitions; join again once the clock is good."""
    clock_probe_s: float = 5.0
    """How often the clock's offset from the broker is measured (a thread, off the cycle)."""

    @property
    def clock_stale_s(self) -> float:
        """A clock verdict older than three probe intervals (with a floor for short ones) is no
        verdict: one lost probe does not stop firing, a dead probe does."""
        return max(3 * self.clock_probe_s, 5.0)

    @property
    def rescue_horizon_s(self) -> float:
        """No rescue of an attempt that became due longer ago than this: a copy then has the
        other half of the retention to reach a worker before the lease it must meet is purged
        (a finished lease is never older than its attempt's due time)."""
        return self.lease_retention_s / 2

    def __post_init__(self) -> None:
        check_heartbeat(
            self.heartbeat_interval_ms,
            self.session_timeout_ms,
            "DUETIME_SCHEDULER_HEARTBEAT_INTERVAL_MS",
        )
        # a rescue window (at least TTL + grace) longer than the horizon could never rescue
        if self.lease_ttl_s + self.rescue_grace_s >= self.rescue_horizon_s:
            raise ConfigError(
                "DUETIME_LEASE_TTL_S + DUETIME_SCHEDULER_RESCUE_GRACE_S "
                f"({self.lease_ttl_s + self.rescue_grace_s:g} s) must stay under half of "
                f"DUETIME_LEASE_RETENTION_S ({self.lease_retention_s:g} s)"
            )

    @classmethod
    def from_env(cls, env: Env) -> SchedulerSettings:
        common = CommonSettings.from_env(env)
        raw_dir = env.opt_str("DUETIME_SCHEDULER_STATE_DIR")
        if raw_dir == ":memory:":
            state_dir = None
        elif raw_dir is None:
            # on disk by default: only the near-term window of jobs stays in RAM
            state_dir = Path(tempfile.gettempdir()) / "duetime-scheduler"
        else:
            state_dir = Path(raw_dir)
        return cls(
            common=common,
            state_dir=state_dir,
            window_s=env.number("DUETIME_SCHEDULER_WINDOW_S", cls.window_s, 1, 86400),
            batch_size=env.integer("DUETIME_SCHEDULER_BATCH", cls.batch_size, 1, 100_000),
            fire_limit=env.integer("DUETIME_SCHEDULER_FIRE_LIMIT", cls.fire_limit, 1, 1_000_000),
            cycle_fire_limit=env.integer(
                "DUETIME_SCHEDULER_CYCLE_FIRE_LIMIT", cls.cycle_fire_limit, 1, 1_000_000
            ),
            misfire_threshold_s=env.number(
                "DUETIME_MISFIRE_THRESHOLD_S", cls.misfire_threshold_s, 0.1, 86400
            ),
            fairness_inflight=env.integer(
                "DUETIME_SCHEDULER_FAIRNESS_INFLIGHT", cls.fairness_inflight, 1, 100_000
            ),
            catch_up_cap=env.integer("DUETIME_CATCH_UP_CAP", cls.catch_up_cap, 0, 100_000),
            catch_up_window_s=env.number(
                "DUETIME_CATCH_UP_WINDOW_S", cls.catch_up_window_s, 0, 30 * 86400
            ),
            session_timeout_ms=env.integer(
                "DUETIME_SESSION_TIMEOUT_MS", cls.session_timeout_ms, 500, 300_000
            ),
            heartbeat_interval_ms=env.integer(
                "DUETIME_SCHEDULER_HEARTBEAT_INTERVAL_MS", cls.heartbeat_interval_ms, 100, 60_000
            ),
            transaction_timeout_ms=env.integer(
                "DUETIME_SCHEDULER_TRANSACTION_TIMEOUT_MS",
                cls.transaction_timeout_ms,
                1000,
                900_000,
            ),
            commit_interval_s=env.number(
                "DUETIME_SCHEDULER_COMMIT_INTERVAL_S", cls.commit_interval_s, 0.0, 10.0
            ),
            fire_lead_ms=env.integer("DUETIME_SCHEDULER_FIRE_LEAD_MS", cls.fire_lead_ms, 0, 60_000),
            crowd_rate=env.number("DUETIME_SCHEDULER_CROWD_RATE", cls.crowd_rate, 1.0, 1_000_000.0),
            crowd_lead_max_ms=env.integer(
                "DUETIME_SCHEDULER_CROWD_LEAD_MAX_MS", cls.crowd_lead_max_ms, 0, 50_000
            ),
            standby=env.flag("DUETIME_SCHEDULER_STANDBY", cls.standby),
            standby_warm_s=env.number(
                "DUETIME_SCHEDULER_STANDBY_WARM_S", cls.standby_warm_s, 0.0, 3600.0
            ),
            commit_stall_s=env.number(
                "DUETIME_SCHEDULER_COMMIT_STALL_S", cls.commit_stall_s, 1.0, 3600.0
            ),
            # the bounds are the workers' own (consumers/worker/settings.py)
            lease_ttl_s=env.number("DUETIME_LEASE_TTL_S", cls.lease_ttl_s, 0.5, 3600.0),
            rescue_grace_s=env.number(
                "DUETIME_SCHEDULER_RESCUE_GRACE_S", cls.rescue_grace_s, 0.0, 86400.0
            ),
            max_rescues=env.integer("DUETIME_SCHEDULER_MAX_RESCUES", cls.max_rescues, 0, 100),
            lease_retention_s=env.number(
                "DUETIME_LEASE_RETENTION_S", cls.lease_retention_s, 3600.0, 365 * 86400.0
            ),
            max_clock_skew_s=env.number(
                "DUETIME_SCHEDULER_MAX_CLOCK_SKEW_S", cls.max_clock_skew_s, 0.01, 3600.0
            ),
            clock_give_up_s=env.number(
                "DUETIME_SCHEDULER_CLOCK_GIVE_UP_S", cls.clock_give_up_s, 0.0, 86400.0
            ),
            clock_probe_s=env.number("DUETIME_SCHEDULER_CLOCK_PROBE_S", cls.clock_probe_s, 0.1, 60),
        )
