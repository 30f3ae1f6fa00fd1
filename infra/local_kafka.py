"""A real single-node Apache Kafka 4.1 broker (KRaft, no ZooKeeper) started from Python.

Role: give tests, benchmarks and local development a real broker without Docker and without
the release tarball. The broker's jars are resolved from Maven Central by
``infra/kafka/pom.xml`` into a per-user cache; the broker runs as combined
broker+controller (``node.id=1``) bound to 127.0.0.1 only, configured for transactions on
one node and for fast consumer-group failover.

Guarantees:
- ``ensure_jars`` reuses a cache only when a completion marker (holding a hash of the pom)
  is present; a killed or failed download is discarded and redone.
- ``start`` never hangs: every wait has a deadline, and every failure names what it waited
  for, where the logs are, and quotes their last lines. A broker that did not come up is
  stopped before the error is raised.
- ``start`` reuses a live broker named by ``home/kafka.pid`` (the same ``home``), cleans a
  stale pid file, and refuses, with the holder's pid and command, a port that something
  else listens on.
- The broker runs in its own process group (it survives the caller unless stopped, which
  is what reuse is for); ``stop`` sends SIGTERM and SIGKILLs after the deadline.
- KRaft storage in ``home/kafka-data`` is formatted once; a broker killed with SIGKILL
  starts again on the same storage.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from duetime.core.config import Env

from .process import (
    InfraError,
    describe_pid,
    ensure_port_free,
    pid_alive,
    port_open,
    read_pid_file,
    reap,
    stop_process_group,
    tail,
    wait_until,
    write_pid_file,
)

log = logging.getLogger("duetime.infra")

KAFKA_VERSION = "4.1.1"
KAFKA_DIR = Path(__file__).resolve().parent / "kafka"
POM = KAFKA_DIR / "pom.xml"
LOG4J2_XML = KAFKA_DIR / "log4j2.xml"
MARKER = ".duetime-complete"
MAIN_JAR = f"kafka_2.13-{KAFKA_VERSION}.jar"


JVM_OPTS: tuple[str, ...] = ("-XX:TieredStopAtLevel=1",)
# The client JIT (C1) only. A local broker lives for one test session or one benchmark run,
# minutes, and C2 never finished compiling in one: JFR and per-thread CPU of a fresh broker
# under `./run bench worker rate --rate 350 --duration-s 30` put 42-44 % of its CPU in the
# C2 compiler thread (15-17 of 35-38 s over the measured window), still 0.3 core after 60 s
# of load. C1-only code costs more per request (request and network threads +25-35 %), and
# less in all: broker CPU over the window 23-28 s against 27-39 s, over its life (start-up
# included) 30-34 s against 37-50 s, start lateness alike (p99 543-666 ms against
# 481-947 ms; bench/README.md "What one job costs Kafka"). A broker that runs for hours
# would win back that +25 % once C2 is done: a production broker is its operator's to tune.
# The collector stays the JVM's default (G1). The serial collector was tried (one thread, no
# concurrent phases: 4-15 % less broker CPU to start and per job) and reverted: its
# stop-the-world young collections showed up as start lateness. `./run bench worker rate
# --rate 350 --duration-s 30` on a quiet machine, fresh broker each: serial p50 247 / p99
# 642 ms (emit -> visible p50 151 ms), G1 p50 197 / p99 496 ms (120 ms); broker CPU 36.6 vs
# 38.1 s.
"""The broker JVM's options beside the heap size (local and test brokers only: a production
broker is tuned by its operator). ``LocalKafka(jvm_opts=())`` runs the JVM's default JIT (C1
then C2), as a production broker does: the benchmark's comparison holds one such broker over
all its runs and warms it first (``bench.common.warm_bench_stack``)."""


def default_jar_cache() -> Path:
    """``$XDG_CACHE_HOME`` or ``~/.cache``, then ``duetime/kafka-<version>/libs``."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "duetime" / f"kafka-{KAFKA_VERSION}" / "libs"


def broker_properties(
    home: Path,
    port: int,
    controller_port: int,
    partition_dir: Path | None = None,
    extra_listeners: Sequence[tuple[int, int]] = (),
    *,
    node_id: int = 1,
    voters: str | None = None,
    replicas: int = 1,
    min_insync: int = 1,
) -> str:
    """The broker's server.properties: one combined node, transactions, fast failover.

    ``node_id``, ``voters``, ``replicas`` and ``min_insync`` make it one combined node of a
    cluster (``infra/local_cluster.py``): its id, the static quorum
    (``1@127.0.0.1:<port>,2@...``), and the replication factor and ``min.insync.replicas``
    of the internal topics and the broker defaults. Their defaults are the single broker.

    ``partition_dir``: keep the topic partitions there (e.g. on a small tmpfs for a full-disk
    test) while the KRaft metadata log stays in ``home/kafka-data``.
    ``extra_listeners``: (port, advertised port) pairs, one more plaintext listener each, that
    tells its clients the broker is at the advertised port (a proxy in front of that listener:
    the clients' every connection then goes through the proxy).
    """
    data = home / "kafka-data"
    dirs = f"{partition_dir}\nmetadata.log.dir={data}" if partition_dir is not None else data
    names = [f"PROXIED{i + 1}" for i in range(len(extra_listeners))]
    listeners = "".join(
        f",{n}://127.0.0.1:{p}" for n, (p, _) in zip(names, extra_listeners, strict=True)
    )
    advertised = "".join(
        f",{n}://127.0.0.1:{a}" for n, (_, a) in zip(names, extra_listeners, strict=True)
    )
    protocols = "".join(f",{n}:PLAINTEXT" for n in names)
    if voters is None:
        quorum = f"""\
# One combined KRaft node (no ZooKeeper) listening on 127.0.0.1 only.
process.roles=broker,controller
node.id={node_id}
# Static quorum of this one node: formatting needs only a cluster id (no --standalone).
controller.quorum.voters={node_id}@127.0.0.1:{controller_port}
"""
    else:
        quorum = f"""\
# Node {node_id} of a cluster of combined KRaft nodes (no ZooKeeper) on 127.0.0.1 only.
process.roles=broker,controller
node.id={node_id}
# Static quorum of every node: all are formatted with the same cluster id.
controller.quorum.voters={voters}
"""
    return f"""\
# Generated by duetime.infra.local_kafka; rewritten on every start. Do not edit.
{quorum}controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}{listeners}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}{advertised}
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT{protocols}
log.dirs={dirs}

{_replication(replicas, min_insync).rstrip()}
# 50 partitions each by default: creating them delays the first group join and the first
# init_transactions by seconds on a 2-core machine, and one node gains nothing from them.
offsets.topic.num.partitions=5
transaction.state.log.num.partitions=5

# Topics are created explicitly (with their partition counts and compaction); a typo must
# fail instead of creating a stray topic.
auto.create.topics.enable=false
num.partitions=1

# Members join at once instead of waiting 3 s for more members (tests, fast failover).
group.initial.rebalance.delay.ms=0
# Allow session timeouts of 2-3 s for fast scheduler failover (default minimum: 6 s for the
# classic protocol, 45 s for the KIP-848 consumer protocol).
group.min.session.timeout.ms=500
group.consumer.min.session.timeout.ms=500
group.consumer.min.heartbeat.interval.ms=100
# KIP-848 groups' session timeout and heartbeat interval are the broker's (default 45 s and
# 5 s) unless set on the group, as the schedulers and workers do at start (their own values
# win); these defaults serve any other KIP-848 group (a dead member's partitions move after
# 3 s, as with the classic protocol's settings).
group.consumer.session.timeout.ms=3000
group.consumer.heartbeat.interval.ms=500
# After a SIGKILL the restarted node cannot register until the controller has expired the
# dead incarnation's session (default 9 s, so a restart took ~15 s). 3 s still tolerates a
# long stall of the JVM on a loaded 2-core machine before the node fences itself.
broker.session.timeout.ms=3000
broker.heartbeat.interval.ms=500
# Abort timed-out transactions within ~1 s instead of 10 s, so a zombie's open
# transaction stops blocking read_committed consumers sooner.
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
"""


def _replication(replicas: int, min_insync: int) -> str:
    """The internal topics' replication (and, for a cluster, the topics' broker defaults)."""
    if replicas == 1:
        return """\
# One broker: internal topics cannot have more than one replica.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
"""
    return f"""\
# {replicas} replicas of every internal topic; a write is acknowledged (acks=all) once
# {min_insync} hold it, so one broker may be down (or killed) without losing a committed
# offset or transaction state, and without stopping writes.
offsets.topic.replication.factor={replicas}
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_insync}
share.coordinator.state.topic.replication.factor={replicas}
share.coordinator.state.topic.min.isr={min_insync}
# Defaults of topics created without their own settings (duetime's set both per topic).
default.replication.factor={replicas}
min.insync.replicas={min_insync}
# Never elect a replica that missed acknowledged writes (the default, stated: it is why
# min.insync.replicas means something).
unclean.leader.election.enable=false
"""


def _new_cluster_id() -> str:
    """A Kafka Uuid string: url-safe base64 of 16 random bytes, no padding, no leading '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise InfraError(
            "no java on PATH and no JAVA_HOME: Kafka needs Java 17+ "
            "(apt-get install -y openjdk-17-jre-headless)"
        )
    return found


class LocalKafka:
    """A single-node Kafka 4.1 broker whose files all live under ``home``."""

    node_id = 1
    """Its KRaft node id: it is ready once metadata lists it (a cluster's nodes differ)."""

    def __init__(
        self,
        home: Path,
        port: int = 9092,
        controller_port: int = 9093,
        heap_mb: int = 512,
        jar_cache: Path | None = None,
        partition_dir: Path | None = None,
        extra_listeners: Sequence[tuple[int, int]] = (),
        jvm_opts: Sequence[str] = JVM_OPTS,
    ) -> None:
        self.home = Path(home).resolve()
        self.jvm_opts = tuple(jvm_opts)
        self.extra_listeners = tuple(extra_listeners)
        self.port = port
        self.controller_port = controller_port
        self.heap_mb = heap_mb
        self.jar_cache = Path(jar_cache) if jar_cache is not None else default_jar_cache()
        self.data_dir = self.home / "kafka-data"
        self.partition_dir = Path(partition_dir).resolve() if partition_dir is not None else None
        self.log_dir = self.home / "kafka-logs"
        self.pid_file = self.home / "kafka.pid"
        self.properties_file = self.home / "kafka-server.properties"
        self.stdout_log = self.home / "kafka-stdout.log"
        self.server_log = self.log_dir / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._cleaned_stale = False

    # ------------------------------------------------------------------ public API

    @property
    def bootstrap(self) -> str:
        """The ``bootstrap.servers`` value for clients."""
        return f"127.0.0.1:{self.port}"

    def ensure_jars(self, timeout_s: float = 900) -> Path:
        """Resolve the broker's jars into the cache (once) and return the libs directory.

        Concurrent callers (several test processes) serialise on a lock file beside the cache.
        """
        libs = self.jar_cache
        if self._jars_complete(libs):
            return libs
        libs.parent.mkdir(parents=True, exist_ok=True)
        with (libs.parent / f".{libs.name}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._jars_complete(libs):
                return libs
            return self._fetch_jars(libs, timeout_s)

    @staticmethod
    def _jars_complete(libs: Path) -> bool:
        want = hashlib.sha256(POM.read_bytes()).hexdigest()
        marker = libs / MARKER
        return marker.exists() and marker.read_text().strip() == want and (libs / MAIN_JAR).exists()

    def _fetch_jars(self, libs: Path, timeout_s: float) -> Path:
        want = hashlib.sha256(POM.read_bytes()).hexdigest()
        mvn = shutil.which("mvn")
        if mvn is None:
            raise InfraError(
                "Maven (mvn) is not on PATH; it is needed once to fetch the Kafka jars "
                "(apt-get install -y maven)"
            )
        partial = libs.with_name(libs.name + f".partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        log.info(
            "fetching Kafka %s jars with Maven into %s (minutes when cold)", KAFKA_VERSION, libs
        )
        started = time.monotonic()
        cmd = [
            mvn, "-B", "-f", str(POM), "dependency:copy-dependencies",
            "-DincludeScope=runtime", f"-DoutputDirectory={partial}",
        ]  # fmt: skip
        output = self._run_maven(cmd, timeout_s)
        if not (partial / MAIN_JAR).exists():
            shutil.rmtree(partial, ignore_errors=True)
            raise InfraError(
                f"Maven finished but {MAIN_JAR} is missing; last Maven output:\n{output}"
            )
        shutil.rmtree(libs, ignore_errors=True)
        partial.replace(libs)
        (libs / MARKER).write_text(want + "\n")
        n = len(list(libs.glob("*.jar")))
        log.info("fetched %d Kafka jars in %.1f s", n, time.monotonic() - started)
        return libs

    def start(self, timeout_s: float = 120) -> float:
        """Start (or reuse) the broker; return the seconds until it answered metadata."""
        started = time.monotonic()
        if not self.launch(timeout_s):
            return time.monotonic() - started  # reused a live broker
        self.await_ready(max(1.0, timeout_s - (time.monotonic() - started)))
        took = time.monotonic() - started
        log.info("Kafka %s ready on %s in %.1f s", KAFKA_VERSION, self.bootstrap, took)
        return took

    def launch(self, timeout_s: float = 120) -> bool:
        """The first half of ``start``: reuse a live broker (False: nothing to wait for) or
        check the ports, write the properties, format once and launch it (True). A cluster
        launches every node before waiting for any: one node alone has no quorum."""
        started = time.monotonic()
        self.home.mkdir(parents=True, exist_ok=True)
        if self._reuse_existing(timeout_s):
            return False
        # After a stale pid file, the killed broker may still be releasing its sockets.
        grace = 10.0 if self._cleaned_stale else 0.0
        ensure_port_free(self.port, "Kafka (broker listener)", grace)
        ensure_port_free(self.controller_port, "Kafka (controller listener)", grace)
        for port, _ in self.extra_listeners:
            ensure_port_free(port, "Kafka (extra listener)", grace)
        libs = self.ensure_jars()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.properties_file.write_text(self.server_properties())
        self._format_once(libs, deadline=started + timeout_s)
        self._launch(libs)
        return True

    def await_ready(self, timeout_s: float) -> None:
        """The second half of ``start``: wait until the launched broker answers metadata; a
        broker that does not is stopped, and the error quotes its logs."""
        try:
            self._wait_ready(timeout_s)
        except (TimeoutError, InfraError) as exc:
            self._stop_after_failure()
            raise InfraError(f"Kafka did not start: {exc}\n{self._logs_for_error()}") from None

    def server_properties(self) -> str:
        """The broker's server.properties (a subclass may add listeners, e.g. SASL_SSL)."""
        return broker_properties(
            self.home,
            self.port,
            self.controller_port,
            self.partition_dir,
            self.extra_listeners,
        )

    def client_conf(self) -> dict[str, str]:
        """librdkafka properties that reach this broker (a secured subclass adds its own)."""
        return {"bootstrap.servers": self.bootstrap}

    def stop(self, timeout_s: float = 30) -> None:
        """Stop the broker named by the pid file (SIGTERM, then SIGKILL after the deadline)."""
        pid = self._proc.pid if self._proc is not None else read_pid_file(self.pid_file)
        if pid is not None and self._is_our_broker(pid):
            stop_process_group(pid, timeout_s, "Kafka broker")
        self._proc = None
        self.pid_file.unlink(missing_ok=True)

    def is_running(self) -> bool:
        """True when the broker of this ``home`` is alive and accepts connections."""
        pid = read_pid_file(self.pid_file)
        return pid is not None and self._is_our_broker(pid) and port_open(self.port)

    @property
    def pid(self) -> int | None:
        """The broker's process id, when its pid file names our live broker."""
        pid = read_pid_file(self.pid_file)
        return pid if pid is not None and self._is_our_broker(pid) else None

    # ------------------------------------------------------------------ internals

    def _run_maven(self, cmd: list[str], timeout_s: float) -> str:
        """Run Maven, logging progress every few seconds; return its last output lines."""
        lines: list[str] = []
        downloaded = 0
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(KAFKA_DIR),
            text=True,
            errors="replace",
        )
        assert proc.stdout is not None
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        last_report = time.monotonic()
        try:
            for line in proc.stdout:
                line = line.rstrip()
                lines.append(line)
                del lines[:-40]
                if "Downloaded from" in line:
                    downloaded += 1
                log.debug("mvn: %s", line)
                if time.monotonic() - last_report >= 5:
                    last_report = time.monotonic()
                    log.info("Maven still resolving: %d files downloaded so far", downloaded)
            rc = proc.wait()
        finally:
            timer.cancel()
        output = "\n".join(lines[-30:])
        if rc != 0:
            raise InfraError(
                f"Maven failed (exit {rc}, timeout {timeout_s:.0f} s) fetching Kafka jars with "
                f"{' '.join(cmd)}; last output:\n{output}"
            )
        return output

    def _java_cmd(self, libs: Path, *jvm_opts: str) -> list[str]:
        # DUETIME_KAFKA_LOG4J2: another log configuration, for a diagnosis (e.g. the
        # request logger at DEBUG: bench/README.md, "What one job costs Kafka")
        log4j2 = Env().opt_str("DUETIME_KAFKA_LOG4J2") or LOG4J2_XML
        return [
            _java(),
            *jvm_opts,
            f"-Dlog4j2.configurationFile={log4j2}",
            f"-Dduetime.kafka.log.dir={self.log_dir}",
            "-Djava.awt.headless=true",
            "-cp",
            f"{libs}/*",
        ]

    def _format_once(self, libs: Path, deadline: float) -> None:
        """Format KRaft storage unless ``meta.properties`` says it already is."""
        dirs = [self.data_dir] + ([self.partition_dir] if self.partition_dir is not None else [])
        if all((d / "meta.properties").exists() for d in dirs):
            return
        # A half-written directory from a killed format is discarded.
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        cmd = [
            *self._java_cmd(libs), "kafka.tools.StorageTool", "format",
            "-t", self._cluster_id(), "-c", str(self.properties_file),
            *self._format_args(),
        ]  # fmt: skip
        log.info("formatting KRaft storage in %s", self.data_dir)
        try:
            res = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=max(5.0, deadline - time.monotonic()),
            )
        except subprocess.TimeoutExpired:
            raise InfraError(f"timed out formatting Kafka storage in {self.data_dir}") from None
        if res.returncode != 0:
            raise InfraError(
                f"formatting Kafka storage failed (exit {res.returncode}):\n"
                f"{res.stdout[-3000:]}{res.stderr[-3000:]}"
            )

    def _cluster_id(self) -> str:
        """The id to format with: a new one (a cluster's nodes share theirs)."""
        return _new_cluster_id()

    def _format_args(self) -> list[str]:
        """More StorageTool format arguments (a subclass adds SCRAM users with --add-scram)."""
        return []

    def _launch(self, libs: Path) -> None:
        heap = (
            f"-Xms{min(128, self.heap_mb)}m",
            f"-Xmx{self.heap_mb}m",
            "-XX:+ExitOnOutOfMemoryError",
            *self.jvm_opts,
        )
        cmd = [
            *self._java_cmd(libs, *heap),
            "kafka.Kafka",
            str(self.properties_file),
        ]
        out: IO[bytes]
        with self.stdout_log.open("ab") as out:
            out.write(f"\n--- duetime: starting Kafka at {time.ctime()} ---\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(self.home),
                start_new_session=True,
            )
        write_pid_file(self.pid_file, self._proc.pid)
        log.info("started Kafka broker pid %d (logs: %s)", self._proc.pid, self.server_log)

    def _metadata_probe(self) -> Callable[[], bool]:
        """A predicate: the broker accepts connections and lists itself in metadata."""
        from confluent_kafka.admin import AdminClient

        # log_level 0: no "connection refused" lines from librdkafka while the broker boots.
        admin = AdminClient({**self.client_conf(), "log_level": 0})

        def answers() -> bool:
            if not port_open(self.port):
                return False
            try:
                md = admin.list_topics(timeout=2)
            except Exception:
                return False
            return self.node_id in md.brokers

        return answers

    def _wait_ready(self, timeout_s: float) -> None:
        def died() -> str | None:
            proc = self._proc
            if proc is not None and proc.poll() is not None:
                return f"the broker process exited with code {proc.returncode}"
            return None

        wait_until(
            self._metadata_probe(),
            timeout_s,
            f"the Kafka broker to answer a metadata request on {self.bootstrap}",
            interval_s=0.25,
            abort=died,
        )

    def _is_our_broker(self, pid: int) -> bool:
        """True when ``pid`` is a live java running kafka.Kafka with our properties file."""
        if not pid_alive(pid):
            return False
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return b"kafka.Kafka" in args and str(self.properties_file).encode() in args

    def _runs_our_jars(self, pid: int) -> bool:
        """True when ``pid``'s class path is this version's jar cache (see ``_java_cmd``)."""
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return True  # gone: nothing to warn about
        return f"{self.jar_cache}/*".encode() in args

    def _reuse_existing(self, timeout_s: float) -> bool:
        """Reuse a live broker from the pid file, or clean a stale pid file."""
        self._cleaned_stale = False
        pid = read_pid_file(self.pid_file)
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        if not self._is_our_broker(pid):
            log.info("removing stale Kafka pid file %s (pid %d: %s)",
                     self.pid_file, pid, describe_pid(pid))  # fmt: skip
            reap(pid)
            self.pid_file.unlink(missing_ok=True)
            self._cleaned_stale = True
            return False
        log.info("reusing running Kafka broker pid %d on %s", pid, self.bootstrap)
        if not self._runs_our_jars(pid):
            # A broker started before KAFKA_VERSION changed (e.g. the shared test stack, kept
            # up while any session uses it) serves on its own version until it is stopped.
            log.warning(
                "Kafka broker pid %d was not started from %s (Kafka %s): it keeps its own "
                "version until stopped",
                pid, self.jar_cache, KAFKA_VERSION,
            )  # fmt: skip
        try:
            wait_until(
                self._metadata_probe(),
                timeout_s,
                f"the running Kafka broker (pid {pid}) to answer metadata on {self.bootstrap}",
                interval_s=0.25,
                abort=lambda: None if pid_alive(pid) else f"pid {pid} exited",
            )
        except (TimeoutError, InfraError) as exc:
            raise InfraError(
                f"found Kafka broker pid {pid} from {self.pid_file} but cannot use it: {exc}; "
                f"stop it (LocalKafka.stop) or kill it.\n{self._logs_for_error()}"
            ) from None
        return True

    def _stop_after_failure(self) -> None:
        if self._proc is not None:
            try:
                stop_process_group(self._proc.pid, 10, "Kafka broker (failed start)")
            except InfraError as exc:
                log.error("%s", exc)
            self._proc = None
        self.pid_file.unlink(missing_ok=True)

    def _logs_for_error(self) -> str:
        return (
            f"--- last 30 lines of {self.server_log} ---\n{tail(self.server_log)}\n"
            f"--- last 30 lines of {self.stdout_log} ---\n{tail(self.stdout_log)}"
        )
