"""duetime's own clients against a SASL_SSL broker, configured by ``DUETIME_KAFKA_*`` alone.

The broker (infra/local_kafka_secure.py) is started by this module in a temporary directory,
on free ports of 127.0.0.1, with a CA made for it; it is stopped at the end. Nothing here
touches the shared test broker.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message
from confluent_kafka.admin import NewTopic

from duetime.core import kafka
from duetime.core.aiokafka_auth import aiokafka_auth
from duetime.core.config import CommonSettings, Env
from duetime.core.errors import ConfigError, RetryableError
from duetime.core.kafka_properties import FILE_VARIABLE
from duetime.core.records import JobDefinition
from duetime.core.topics import Topics
from duetime.infra.local_kafka_secure import SecureLocalKafka
from duetime.infra.process import free_port
from duetime.producers.sdk import JobClient
from duetime.schemas.codec import Codec


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureLocalKafka]:
    users = {"alice": secrets.token_hex(12), "bob": secrets.token_hex(12)}
    kafka_home = tmp_path_factory.mktemp("kafka-sasl-ssl")
    port, controller, internal, mtls = (free_port() for _ in range(4))
    node = SecureLocalKafka(kafka_home, port, controller, internal, users, mtls_port=mtls)
    try:
        took_s = node.start(timeout_s=180)
        print(f"SASL_SSL broker ready in {took_s:.1f} s")  # a figure for the report (-s)
        yield node
    finally:
        node.stop()


def _settings(env: dict[str, str]) -> CommonSettings:
    return CommonSettings.from_env(
        Env({**env, "DUETIME_TOPIC_PREFIX": f"sec{uuid.uuid4().hex[:8]}."})
    )


def _create_topic(
    settings: CommonSettings, name: str, config: dict[str, str] | None = None
) -> None:
    admin = kafka.admin(settings)  # kept alive until the futures resolve
    futures = admin.create_topics(
        [NewTopic(name, 1, 1, config=config or {})], operation_timeout=30, request_timeout=30
    )
    for future in futures.values():
        future.result(timeout=60)


def _read(consumer: Consumer, topic: str, want: int, timeout_s: float = 60) -> list[Message]:
    consumer.subscribe([topic])
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < want and time.monotonic() < deadline:
            for msg in kafka.read_batch(consumer, want, 0.5):
                error = msg.error()
                if error is None:
                    got.append(msg)
                elif error.code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(f"consumer error: {error}")
    finally:
        consumer.close()
    return got


def _round_trip(settings: CommonSettings) -> None:
    """Produce three records and read them back with both consumer kinds of the roles."""
    kafka.check_connection(settings, timeout_s=30)
    topic = settings.topic_prefix + "probe"
    _create_topic(settings, topic)
    producer = kafka.producer(settings, **{"acks": "all"})
    errors: list[KafkaError] = []
    for i in range(3):
        producer.produce(
            topic,
            key=f"k{i}",
            value=f"v{i}".encode(),
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
    assert producer.flush(30) == 0 and errors == []
    classic = _read(kafka.consumer(settings, f"{topic}-classic"), topic, 3)
    assert [m.value() for m in classic] == [b"v0", b"v1", b"v2"]
    kip848 = _read(kafka.kip848_consumer(settings, f"{topic}-kip848"), topic, 3)
    assert sorted(m.value() or b"" for m in kip848) == [b"v0", b"v1", b"v2"]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_clients_reach_a_sasl_ssl_broker_with_variables_only(
    broker: SecureLocalKafka, mechanism: str
) -> None:
    _round_trip(_settings(broker.client_env("alice", mechanism)))


def test_a_properties_file_configures_the_clients(broker: SecureLocalKafka, tmp_path: Path) -> None:
    env = broker.client_env("bob", "SCRAM-SHA-512")
    path = tmp_path / "client.properties"
    path.write_text(
        "# what an operator would mount from a secret\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        f"sasl.username={env['DUETIME_KAFKA_SASL_USERNAME']}\n"
        f"sasl.password={env['DUETIME_KAFKA_SASL_PASSWORD']}\n"
        f"ssl.ca.location={env['DUETIME_KAFKA_SSL_CA_LOCATION']}\n"
    )
    settings = _settings({"DUETIME_KAFKA_BOOTSTRAP": broker.bootstrap, FILE_VARIABLE: str(path)})
    assert env["DUETIME_KAFKA_SASL_PASSWORD"] not in repr(settings)
    _round_trip(settings)


def test_a_wrong_password_is_a_clear_error_that_shows_no_password(
    broker: SecureLocalKafka, capfd: pytest.CaptureFixture[str]
) -> None:
    wrong = "wrong-" + secrets.token_hex(8)
    right = broker.users["alice"]
    env = {**broker.client_env("alice"), "DUETIME_KAFKA_SASL_PASSWORD": wrong}
    settings = _settings(env)
    with pytest.raises(ConfigError) as info:
        kafka.check_connection(settings, timeout_s=15)
    message = info.value.message
    assert "refused the login" in message and "SCRAM-SHA-256" in message, message
    assert "DUETIME_KAFKA_SASL_PASSWORD" in message and "DUETIME_KAFKA_SASL_USERNAME" in message
    assert info.value.details["kafka_error"] == "_AUTHENTICATION"
    # nowhere: not in the error, the settings' repr, or what librdkafka printed meanwhile
    out, err = capfd.readouterr()
    for text in (message, str(info.value.details), repr(settings), out, err):
        assert wrong not in text and right not in text


def test_an_untrusted_broker_certificate_is_a_clear_error(broker: SecureLocalKafka) -> None:
    env = broker.client_env("alice")
    del env["DUETIME_KAFKA_SSL_CA_LOCATION"]  # the system's CAs never signed the test CA
    with pytest.raises(ConfigError) as info:
        kafka.check_connection(_settings(env), timeout_s=15)
    assert "TLS handshake failed" in info.value.message
    assert "certificate verify failed" in info.value.message
    assert broker.users["alice"] not in info.value.message


def test_the_sdk_publishes_a_job_to_the_secured_broker(broker: SecureLocalKafka) -> None:
    settings = _settings(broker.client_env("alice", "SCRAM-SHA-512"))
    topics = Topics(settings.topic_prefix)
    jobs = next(spec for spec in topics.specs(1) if spec.name == topics.jobs)
    _create_topic(settings, jobs.name, jobs.config)
    with JobClient(settings=settings) as client:
        created = client.create_job(
            name="secured",
            schedule={"cron": "0 2 * * *", "timezone": "UTC"},
            target={"type": "http", "url": "http://127.0.0.1:9/hook"},
        )
    [msg] = _read(kafka.consumer(settings, f"{jobs.name}-reader"), jobs.name, 1)
    codec = Codec(registry_url=None)
    try:
        record = codec.load(
            JobDefinition, msg.value() or b"", topic=jobs.name, partition=0, offset=msg.offset()
        )
    finally:
        codec.close()
    assert record.job_id == created.job_id and record.name == "secured"


def test_the_cli_creates_every_topic_on_the_secured_broker(broker: SecureLocalKafka) -> None:
    prefix = f"cli{uuid.uuid4().hex[:8]}."
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    env.update(broker.client_env("bob"), DUETIME_TOPIC_PREFIX=prefix, DUETIME_PARTITIONS="1")
    cli = Path(sys.executable).with_name("duetime")
    done = subprocess.run(
        [str(cli), "topics", "create"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    specs = Topics(prefix).specs(1)
    assert f"{len(specs)} topics created" in done.stdout
    listed = kafka.admin(_settings(broker.client_env("alice"))).list_topics(timeout=30).topics
    assert {s.name for s in specs} <= set(listed)
    assert broker.users["bob"] not in done.stdout + done.stderr


def test_mutual_tls_with_a_client_certificate(broker: SecureLocalKafka) -> None:
    key_password = secrets.token_hex(8)
    cert, key = broker.issue_client_certificate("carol", key_password)
    env = {
        "DUETIME_KAFKA_BOOTSTRAP": broker.mtls_bootstrap,
        "DUETIME_KAFKA_SECURITY_PROTOCOL": "SSL",
        "DUETIME_KAFKA_SSL_CA_LOCATION": str(broker.ca_file),
        "DUETIME_KAFKA_SSL_CERTIFICATE_LOCATION": str(cert),
        "DUETIME_KAFKA_SSL_KEY_LOCATION": str(key),
        "DUETIME_KAFKA_SSL_KEY_PASSWORD": key_password,
    }
    settings = _settings(env)
    assert key_password not in repr(settings)
    _round_trip(settings)
    _aiokafka_round_trip(_settings(env))  # the encrypted key loads in Python's ssl too
    # the same without a certificate: the listener refuses the client
    anonymous = {k: v for k, v in env.items() if "CERTIFICATE" not in k and "KEY" not in k}
    with pytest.raises(ConfigError) as info:
        kafka.check_connection(_settings(anonymous), timeout_s=15)
    assert "TLS handshake failed" in info.value.message


def _aiokafka_round_trip(settings: CommonSettings) -> None:
    """aiokafka (faust's client) with aiokafka_auth's arguments: what the resolver needs."""
    from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]  # no stubs shipped

    topic = settings.topic_prefix + "aiokafka"
    _create_topic(settings, topic)

    async def send() -> None:
        auth = aiokafka_auth(settings.kafka_properties)
        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, **auth.kwargs())
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"from aiokafka")
        finally:
            await producer.stop()

    asyncio.run(send())
    [msg] = _read(kafka.consumer(settings, f"{topic}-reader"), topic, 1)
    assert msg.value() == b"from aiokafka"


def test_the_resolvers_client_library_reaches_it_from_the_same_variables(
    broker: SecureLocalKafka,
) -> None:
    _aiokafka_round_trip(_settings(broker.client_env("bob", "SCRAM-SHA-512")))


def test_nobody_listening_is_a_retryable_error_naming_the_servers() -> None:
    port = free_port()
    settings = _settings(
        {"DUETIME_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}", "DUETIME_KAFKA_LOG__LEVEL": "0"}
    )
    with pytest.raises(RetryableError) as info:
        kafka.check_connection(settings, timeout_s=2)
    assert f"127.0.0.1:{port} did not answer within 2 s" in info.value.message


def test_the_resolver_role_runs_on_the_secured_broker(broker: SecureLocalKafka) -> None:
    """The one role on aiokafka (faust) takes the same variables: it creates its topics,
    joins its group, reads an input and writes the poison copy of a bad record, all over
    SASL_SSL with SCRAM."""
    prefix = f"res{uuid.uuid4().hex[:8]}."
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    env.update(
        broker.client_env("alice", "SCRAM-SHA-256"),
        DUETIME_TOPIC_PREFIX=prefix,
        DUETIME_PARTITIONS="1",
        DUETIME_METRICS_PORT=str(free_port()),
    )
    settings = _settings(broker.client_env("alice", "SCRAM-SHA-256"))
    topics = Topics(prefix)
    create = subprocess.run(
        [str(Path(sys.executable).with_name("duetime")), "topics", "create"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert create.returncode == 0, create.stderr[-3000:]
    resolver = subprocess.Popen(
        [str(Path(sys.executable).with_name("duetime")), "resolver"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        producer = kafka.producer(settings)
        producer.produce(topics.results, key=b"k", value=b"\x00not avro")
        assert producer.flush(30) == 0
        reader = kafka.consumer(settings, f"{prefix}poison-reader")
        [parked] = _read(reader, topics.poison, 1, timeout_s=120)
        headers = dict(parked.headers() or [])
        assert headers["duetime-role"] == b"resolver"
        assert parked.value() == b"\x00not avro"
    finally:
        resolver.terminate()
        out, _ = resolver.communicate(timeout=60)
    assert broker.users["alice"] not in out
