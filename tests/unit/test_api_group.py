"""The group committer's pure part (which queued creates make the next group), its
settings, and the size count of a job's fields that every create runs; the committer itself
is tested against the real stack in tests/integration/test_api_group.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.config import Env
from duetime.core.errors import ConfigError
from duetime.core.jobspec import json_size
from duetime.producers.api.group import take_group
from duetime.producers.api.settings import ApiSettings


@given(st.lists(st.sampled_from("abcdefgh"), max_size=40), st.integers(1, 12))
def test_a_group_is_bounded_holds_each_job_id_once_and_loses_nothing(
    ids: list[str], max_jobs: int
) -> None:
    taken, left = take_group(ids, max_jobs)
    assert sorted(taken + left) == list(range(len(ids)))  # every create: now or later
    assert taken == sorted(taken) and left == sorted(left)  # arrival order kept
    assert len(taken) <= max_jobs
    assert len({ids[i] for i in taken}) == len(taken)
    if ids:
        assert taken[0] == 0  # the oldest create always goes: nothing waits forever
    # a create is left only because its id is already in the group or the group is full
    for i in left:
        assert len(taken) == max_jobs or ids[i] in {ids[j] for j in taken}


def test_group_settings_come_from_their_variables_and_are_checked() -> None:
    s = ApiSettings.from_env(
        Env({"DUETIME_API_GROUP_MAX_JOBS": "200", "DUETIME_API_GROUP_WAIT_MS": "0.5"})
    )
    assert (s.group_max_jobs, s.group_wait_ms) == (200, 0.5)
    default = ApiSettings.from_env(Env({}))
    assert (default.group_max_jobs, default.group_wait_ms) == (64, 2.0)
    for name, value in (
        ("DUETIME_API_GROUP_MAX_JOBS", "0"),
        ("DUETIME_API_GROUP_MAX_JOBS", "1001"),
        ("DUETIME_API_GROUP_MAX_JOBS", "many"),
        ("DUETIME_API_GROUP_WAIT_MS", "-1"),
        ("DUETIME_API_GROUP_WAIT_MS", "nan"),
        ("DUETIME_API_GROUP_WAIT_MS", "5000"),
    ):
        with pytest.raises(ConfigError) as bad:
            ApiSettings.from_env(Env({name: value}))
        assert bad.value.details["variable"] == name


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(json_values)
def test_a_fields_size_is_its_json_size_without_json_for_plain_values(value: Any) -> None:
    # the create path counts None and numbers without json.dumps: the figures must not move
    expected = (
        len(value.encode())
        if isinstance(value, str)
        else len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    )
    assert json_size(value) == expected
