"""A role gives its KIP-848 group its own session timeout and heartbeat interval.

Under KIP-848 both are the broker's settings (Kafka's defaults: 45 s and 5 s), so without
this a SIGKILLed worker's queued work would wait 45 s on an operator's broker.
"""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from duetime.core import kafka
from duetime.core.config import CommonSettings
from tests.helpers import wait_for
from tests.integration.test_worker import start_worker


def _timing(settings: CommonSettings, group: str) -> tuple[str, str]:
    """The group's session timeout and heartbeat interval, as the broker describes them."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    resource = ConfigResource(ResourceType.GROUP, group)
    entries = admin.describe_configs([resource])[resource].result(timeout=10)
    return (
        entries["consumer.session.timeout.ms"].value,
        entries["consumer.heartbeat.interval.ms"].value,
    )


def test_both_are_set_on_the_group_and_a_refusal_is_returned(settings: CommonSettings) -> None:
    group = f"{settings.topic_prefix}timing"
    assert kafka.set_group_timing(settings, group, 4000, 1300) is None
    # the controller's record reaches the broker's view a moment later (~0.2 s here)
    wait_for(lambda: _timing(settings, group) == ("4000", "1300"), 10, "the group's new timing")
    # under the broker's group.consumer.min.heartbeat.interval.ms (100 ms here): refused,
    # returned rather than raised, and the group keeps what it had
    refused = kafka.set_group_timing(settings, group, 4000, 50)
    assert refused is not None
    assert _timing(settings, group) == ("4000", "1300")


def test_a_worker_sets_its_pools_group_before_it_joins(settings: CommonSettings) -> None:
    running = start_worker(settings, session_timeout_ms=3500, heartbeat_interval_ms=1200)
    try:
        group = running.worker.settings.group
        wait_for(lambda: _timing(settings, group) == ("3500", "1200"), 10, "the pool's timing")
    finally:
        running.stop()
