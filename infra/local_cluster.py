"""A local Kafka 4.1 cluster of combined KRaft nodes on 127.0.0.1 (``infra up --brokers 3``).

Role: a replicated Kafka for tests, fault scenarios and local development, without Docker:
:class:`LocalCluster` runs N :class:`ClusterNode` processes, each a
:class:`~infra.local_kafka.LocalKafka` (same jars, same start/stop/reuse guarantees, same fast
failover settings) in its own directory ``home/node-<id>``.

Why combined nodes (``process.roles=broker,controller`` in every JVM) rather than three
controllers beside three brokers: three JVMs instead of six on a 2-core machine, each with a
small heap, and the static quorum of three voters still survives one node lost. Killing a
node then kills a broker *and* a controller (perhaps the active one), as a real machine
failure does, so a fault scenario exercises controller failover too.

Guarantees:
- Every node is formatted with one cluster id, kept in ``home/cluster.id`` (recovered from a
  node's ``meta.properties`` when that file is lost), so a node restarted on its storage
  rejoins the same cluster.
- ``start`` launches every node before waiting for any (one node alone has no quorum and
  would never answer); every wait has a deadline; a node that fails stops the whole start,
  and every node it launched is stopped before the error (which quotes that node's logs).
- Internal topics get ``replicas`` = min(3, nodes) replicas with ``min.insync`` a majority
  of them (:func:`infra.topics.min_insync_replicas`); the same pair is the broker default for
  topics. ``stop`` stops every node at once (one at a time, the last node would wait for a
  quorum that is gone before the SIGKILL).
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from duetime.core.errors import ConfigError

from .local_kafka import LocalKafka, _new_cluster_id, broker_properties
from .process import InfraError, kill_group
from .topics import cluster_replication

log = logging.getLogger("duetime.infra")

CLUSTER_HEAP_MB = 384
"""Per node: three JVMs share a 2-core machine with the roles; 384 MB holds a test load."""

_CLUSTER_ID_RE = re.compile(r"^cluster\.id=(\S+)$", re.MULTILINE)


class ClusterNode(LocalKafka):
    """One combined broker+controller node of a :class:`LocalCluster`."""

    def __init__(
        self,
        home: Path,
        node_id: int,
        port: int,
        controller_port: int,
        voters: str,
        cluster_id_file: Path,
        replicas: int,
        min_insync: int,
        heap_mb: int = CLUSTER_HEAP_MB,
        jar_cache: Path | None = None,
    ) -> None:
        super().__init__(home, port, controller_port, heap_mb=heap_mb, jar_cache=jar_cache)
        self.node_id = node_id
        self.voters = voters
        self.cluster_id_file = cluster_id_file
        self.replicas = replicas
        self.min_insync = min_insync

    def server_properties(self) -> str:
        return broker_properties(
            self.home,
            self.port,
            self.controller_port,
            node_id=self.node_id,
            voters=self.voters,
            replicas=self.replicas,
            min_insync=self.min_insync,
        )

    def _cluster_id(self) -> str:
        return shared_cluster_id(self.cluster_id_file)


def shared_cluster_id(path: Path) -> str:
    """The cluster's id from ``path``; else from a node's formatted storage beside it; else a
    new one. Written to ``path`` (atomically) so every node is formatted with the same id."""
    with contextlib.suppress(OSError):
        found = path.read_text().strip()
        if found:
            return found
    cid = None
    for meta in sorted(path.parent.glob("node-*/kafka-data/meta.properties")):
        with contextlib.suppress(OSError):
            match = _CLUSTER_ID_RE.search(meta.read_text())
            if match:
                cid = match.group(1)
                break
    cid = cid or _new_cluster_id()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(cid + "\n")
    partial.replace(path)
    return cid


def cluster_ports(nodes: int, kafka_port: int, controller_port: int) -> list[tuple[int, int]]:
    """(broker, controller) ports of each node: node i (from 0) uses ``kafka_port + 2i`` and
    ``controller_port + 2i``, so node 1 has the single broker's ports (the same bootstrap)
    and the defaults 9092/9093 give 9092-9097. Raises ConfigError when two coincide or one
    is out of range, naming them and the variables."""
    ports = [(kafka_port + 2 * i, controller_port + 2 * i) for i in range(nodes)]
    flat = [p for pair in ports for p in pair]
    clashes = sorted({p for p in flat if flat.count(p) > 1})
    if clashes:
        raise ConfigError(
            f"DUETIME_KAFKA_PORT={kafka_port} and DUETIME_KAFKA_CONTROLLER_PORT="
            f"{controller_port} give {nodes} nodes overlapping ports {clashes}: node i uses "
            "both plus 2*i (set the controller port to the broker port + 1)",
            details={"variable": "DUETIME_KAFKA_CONTROLLER_PORT", "ports": clashes},
        )
    if min(flat) < 1 or max(flat) > 65535:
        raise ConfigError(
            f"{nodes} Kafka nodes from DUETIME_KAFKA_PORT={kafka_port} and "
            f"DUETIME_KAFKA_CONTROLLER_PORT={controller_port} need ports above 65535",
            details={"variable": "DUETIME_KAFKA_PORT"},
        )
    return ports


def free_port_block(count: int, attempts: int = 50) -> int:
    """A base port with ``count`` consecutive free ports on 127.0.0.1 (for a test cluster on
    its own ports); raises InfraError when none is found."""
    import random

    for _ in range(attempts):
        base = random.randrange(20000, 30000 - count)
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise InfraError(f"found no {count} consecutive free ports in {attempts} attempts")


class LocalCluster:
    """``nodes`` combined KRaft nodes under ``home`` (``home/node-<id>``), see the module."""

    def __init__(
        self,
        home: Path,
        ports: Sequence[tuple[int, int]],
        heap_mb: int = CLUSTER_HEAP_MB,
        jar_cache: Path | None = None,
    ) -> None:
        if len(ports) < 3 or len(ports) % 2 == 0:
            raise ValueError(
                f"a cluster needs an odd number of nodes, at least 3 (a quorum that survives "
                f"a lost node), not {len(ports)}"
            )
        self.home = Path(home).resolve()
        self.replicas, self.min_insync = cluster_replication(len(ports))
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_, c) in enumerate(ports))
        self.nodes = [
            ClusterNode(
                self.home / f"node-{i + 1}",
                i + 1,
                port,
                controller_port,
                voters,
                self.home / "cluster.id",
                self.replicas,
                self.min_insync,
                heap_mb=heap_mb,
                jar_cache=jar_cache,
            )
            for i, (port, controller_port) in enumerate(ports)
        ]

    @property
    def bootstrap(self) -> str:
        """Every node: a client reaches the cluster while any one of them is up."""
        return ",".join(n.bootstrap for n in self.nodes)

    def client_conf(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    def node(self, node_id: int) -> ClusterNode:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"no node {node_id} (nodes: {[n.node_id for n in self.nodes]})")

    def ensure_jars(self) -> Path:
        return self.nodes[0].ensure_jars()

    def start(self, timeout_s: float = 180) -> float:
        """Start (or reuse) every node; the seconds until all of them answered metadata."""
        started = time.monotonic()
        self.ensure_jars()
        launched: list[ClusterNode] = []
        try:
            for n in self.nodes:
                remaining = max(1.0, timeout_s - (time.monotonic() - started))
                if n.launch(remaining):
                    launched.append(n)
            for n in launched:
                n.await_ready(max(1.0, timeout_s - (time.monotonic() - started)))
        except BaseException:
            self._stop_nodes(launched, 20)
            raise
        took = time.monotonic() - started
        log.info("Kafka cluster of %d nodes ready on %s in %.1f s",
                 len(self.nodes), self.bootstrap, took)  # fmt: skip
        return took

    def start_node(self, node_id: int, timeout_s: float = 180) -> float:
        """Start one node again (on its storage) while the others run; seconds until ready."""
        return self.node(node_id).start(timeout_s)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node's process group and wait until it is gone (a crashed machine)."""
        n = self.node(node_id)
        pid = n.pid
        if pid is None:
            return
        kill_group(pid, f"Kafka node {node_id} pid {pid}", 30)
        n.pid_file.unlink(missing_ok=True)
        n._proc = None

    def stop(self, timeout_s: float = 30) -> None:
        """Stop every node at once."""
        self._stop_nodes(self.nodes, timeout_s)

    def is_running(self) -> bool:
        return all(n.is_running() for n in self.nodes)

    def status(self) -> list[tuple[ClusterNode, bool]]:
        return [(n, n.is_running()) for n in self.nodes]

    @staticmethod
    def _stop_nodes(nodes: Sequence[ClusterNode], timeout_s: float) -> None:
        if not nodes:
            return
        errors: list[str] = []

        def stop(n: ClusterNode) -> None:
            try:
                n.stop(timeout_s)
            except InfraError as exc:
                errors.append(str(exc))

        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            list(pool.map(stop, nodes))
        if errors:
            raise InfraError("; ".join(errors))


def partition_leaders(
    bootstrap_servers: str, topics: Sequence[str], timeout_s: float = 10
) -> dict[tuple[str, int], int]:
    """The leader's node id of every partition of ``topics`` (-1: none right now), from a
    fresh metadata request (a new client: a cached one may predate a failover)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0})
    md = admin.list_topics(timeout=timeout_s)
    missing = [t for t in topics if t not in md.topics]
    if missing:
        raise InfraError(f"topics not in the cluster's metadata: {missing}")
    return {(t, p): meta.leader for t in topics for p, meta in md.topics[t].partitions.items()}
