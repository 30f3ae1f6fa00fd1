"""Sharing one local stack between processes (infra/stack.py): who else uses it, and a
release that stops the services only when nobody alive does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from duetime.infra.stack import LocalStack, StackSettings


class Recorded(LocalStack):
    """A stack whose services are never started: ``down`` is only counted."""

    downs = 0

    def down(self) -> None:
        self.downs += 1


def test_a_release_stops_only_when_no_other_live_user_remains(tmp_path: Path) -> None:
    stack = Recorded(StackSettings(home=tmp_path))
    users = tmp_path / "users"
    users.mkdir()
    (users / str(os.getpid())).touch()
    (users / "999999999").touch()  # a user that died without releasing
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (users / str(other.pid)).touch()
        assert stack.other_users() == [str(other.pid)]
        assert stack.release() is False and stack.downs == 0
        assert sorted(f.name for f in users.iterdir()) == [str(other.pid)]  # stale ones gone
    finally:
        other.kill()
        other.wait()
    assert stack.other_users() == []
    assert stack.release() is True and stack.downs == 1
    assert list(users.iterdir()) == []
