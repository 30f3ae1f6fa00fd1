"""The three-node cluster's pure parts: server properties, ports, replication rules, the
shared cluster id, and the stack and CLI around them (the real cluster runs in
tests/faults/test_cluster_leader_kill.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.config import CommonSettings, Env
from duetime.core.errors import ConfigError
from duetime.infra.cli import add_infra_arguments
from duetime.infra.local_cluster import LocalCluster, cluster_ports, shared_cluster_id
from duetime.infra.local_kafka import broker_properties
from duetime.infra.stack import LocalStack, StackSettings
from duetime.infra.topics import (
    cluster_replication,
    min_insync_replicas,
    replication_for,
    requested_replication,
    topic_config,
)


def props(text: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines() if line and line[0] != "#"]
    return {k: v for k, v in pairs}


def test_single_broker_properties_keep_one_replica_and_one_voter() -> None:
    p = props(broker_properties(Path("/h"), 9092, 9093))
    assert p["node.id"] == "1"
    assert p["controller.quorum.voters"] == "1@127.0.0.1:9093"
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor"):
        assert p[key] == "1"
    assert p["transaction.state.log.min.isr"] == "1"
    # the single broker leaves topic defaults to Kafka, as before the cluster existed
    assert "default.replication.factor" not in p
    assert "min.insync.replicas" not in p


def test_cluster_nodes_share_the_quorum_and_replicate_internal_topics() -> None:
    ports = cluster_ports(3, 9092, 9093)
    cluster = LocalCluster(Path("/tmp/unused-cluster"), ports)
    texts = [props(n.server_properties()) for n in cluster.nodes]
    assert {t["controller.quorum.voters"] for t in texts} == {
        "1@127.0.0.1:9093,2@127.0.0.1:9095,3@127.0.0.1:9097"
    }
    assert [t["node.id"] for t in texts] == ["1", "2", "3"]
    assert [t["listeners"] for t in texts] == [
        f"PLAINTEXT://127.0.0.1:{b},CONTROLLER://127.0.0.1:{c}" for b, c in ports
    ]
    assert [t["log.dirs"] for t in texts] == [
        f"/tmp/unused-cluster/node-{i}/kafka-data" for i in (1, 2, 3)
    ]
    for t in texts:
        assert t["process.roles"] == "broker,controller"
        assert t["offsets.topic.replication.factor"] == "3"
        assert t["transaction.state.log.replication.factor"] == "3"
        assert t["transaction.state.log.min.isr"] == "2"
        assert t["default.replication.factor"] == "3"
        assert t["min.insync.replicas"] == "2"
        assert t["unclean.leader.election.enable"] == "false"
    assert cluster.bootstrap == "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096"
    assert cluster.node(2).port == 9094
    with pytest.raises(KeyError, match="no node 4"):
        cluster.node(4)


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_a_cluster_needs_an_odd_quorum_of_three_or_more(nodes: int) -> None:
    with pytest.raises(ValueError, match="odd number of nodes"):
        LocalCluster(Path("/tmp/unused"), [(10000 + 2 * i, 10001 + 2 * i) for i in range(nodes)])


@given(st.integers(1, 60000), st.integers(1, 60000), st.integers(1, 5))
def test_cluster_ports_are_distinct_or_refused(broker: int, controller: int, nodes: int) -> None:
    try:
        ports = cluster_ports(nodes, broker, controller)
    except ConfigError as exc:
        assert "DUETIME_KAFKA" in exc.message
        return
    flat = [p for pair in ports for p in pair]
    assert len(set(flat)) == len(flat) == 2 * nodes
    assert ports[0] == (broker, controller)  # node 1 keeps the single broker's address
    assert all(1 <= p <= 65535 for p in flat)


def test_overlapping_ports_name_the_variables() -> None:
    with pytest.raises(ConfigError, match="DUETIME_KAFKA_CONTROLLER_PORT=9094"):
        cluster_ports(3, 9092, 9094)


@given(st.integers(1, 99))
def test_min_insync_is_a_majority(rf: int) -> None:
    m = min_insync_replicas(rf)
    assert 2 * m > rf  # any two acknowledging sets overlap
    assert m <= rf
    assert rf == 1 or m < rf or rf == 2  # from 3 replicas on, one may be down


@given(st.integers(1, 1000))
def test_cluster_replication_is_three_of_three_or_fewer(brokers: int) -> None:
    replicas, min_isr = cluster_replication(brokers)
    assert replicas == min(3, brokers)
    assert min_isr == min_insync_replicas(replicas)
    assert cluster_replication(3) == (3, 2)


def test_replication_rules_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        min_insync_replicas(0)
    with pytest.raises(ValueError):
        cluster_replication(0)


@given(
    st.dictionaries(st.sampled_from(["cleanup.policy", "retention.ms", "min.insync.replicas"]),
                    st.text(min_size=1, max_size=5)),
    st.integers(1, 7),
)  # fmt: skip
def test_topic_config_adds_min_insync_only_when_replicated(config: dict[str, str], rf: int) -> None:
    before = dict(config)
    out = topic_config(config, rf)
    assert config == before  # the spec's own dict is not changed
    if rf == 1 or "min.insync.replicas" in config:
        assert out == config
    else:
        assert out == {**config, "min.insync.replicas": str(rf // 2 + 1)}


@given(st.integers(1, 9), st.one_of(st.none(), st.integers(1, 9)))
def test_replication_for_follows_the_cluster_or_refuses(brokers: int, asked: int | None) -> None:
    if asked is None:
        assert replication_for(None, brokers) == min(3, brokers)
    elif asked > brokers:
        with pytest.raises(ConfigError, match="DUETIME_REPLICATION_FACTOR") as info:
            replication_for(asked, brokers)
        assert info.value.details["brokers"] == brokers
    else:
        assert replication_for(asked, brokers) == asked


def test_requested_replication_is_none_unless_the_variable_is_set() -> None:
    unset = Env({})
    assert requested_replication(unset, CommonSettings.from_env(unset)) is None
    given_env = Env({"DUETIME_REPLICATION_FACTOR": "1"})
    assert requested_replication(given_env, CommonSettings.from_env(given_env)) == 1


def test_shared_cluster_id_is_made_once_and_recovered_from_storage(tmp_path: Path) -> None:
    path = tmp_path / "cluster.id"
    first = shared_cluster_id(path)
    assert shared_cluster_id(path) == first
    assert not first.startswith("-") and len(first) == 22
    # the file lost, a formatted node beside it: its id, not a new one (which would make
    # the node refuse to start)
    path.unlink()
    meta = tmp_path / "node-2" / "kafka-data" / "meta.properties"
    meta.parent.mkdir(parents=True)
    meta.write_text("version=1\ncluster.id=AbCdEfGhIjKlMnOpQrStUv\nnode.id=2\n")
    assert shared_cluster_id(path) == "AbCdEfGhIjKlMnOpQrStUv"
    assert path.read_text().strip() == "AbCdEfGhIjKlMnOpQrStUv"


def test_stack_with_three_brokers_points_at_every_node(tmp_path: Path) -> None:
    one = LocalStack(StackSettings(home=tmp_path, kafka_port=9192, controller_port=9193))
    assert one.bootstrap_servers == "127.0.0.1:9192"
    assert [row[0] for row in one.kafka_status()] == ["kafka"]  # no cluster was ever made
    three = LocalStack(
        StackSettings(home=tmp_path, kafka_port=9192, controller_port=9193, brokers=3)
    )
    assert three.bootstrap_servers == "127.0.0.1:9192,127.0.0.1:9194,127.0.0.1:9196"
    rows = three.kafka_status()
    assert [(name, running) for name, _, running in rows] == [
        ("kafka", False), ("kafka-1", False), ("kafka-2", False), ("kafka-3", False),
    ]  # fmt: skip
    assert three.cluster.nodes[0].heap_mb == 384
    three.down()  # nothing runs: stopping is a no-op, not an error


def test_infra_cli_accepts_one_or_three_brokers() -> None:
    parser = argparse.ArgumentParser()
    add_infra_arguments(parser)
    assert parser.parse_args(["up", "--brokers", "3"]).brokers == 3
    assert parser.parse_args(["status"]).brokers == 1
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--brokers", "2"])
