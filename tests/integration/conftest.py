"""Fixtures shared by the integration tests (a file that needs another kind defines its own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from tests.helpers import TopicReader


@pytest.fixture
def client(settings: CommonSettings) -> Iterator[JobClient]:
    with JobClient(settings=settings) as c:
        yield c


@pytest.fixture
def results(settings: CommonSettings) -> Iterator[TopicReader]:
    reader = TopicReader(settings, [Topics(settings.topic_prefix).results], "result")
    yield reader
    reader.close()


@pytest.fixture
def dlq(settings: CommonSettings) -> Iterator[TopicReader]:
    reader = TopicReader(settings, [Topics(settings.topic_prefix).dlq], "dead_letter")
    yield reader
    reader.close()


@pytest.fixture
def dag_runs(settings: CommonSettings) -> Iterator[TopicReader]:
    reader = TopicReader(settings, [Topics(settings.topic_prefix).dag_runs], "dag_run")
    yield reader
    reader.close()
