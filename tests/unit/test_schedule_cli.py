"""The schedule toolkit's CLI, without an API: flags → request bodies, the progress bar."""

from __future__ import annotations

from duetime.cli import build_parser
from duetime.producers.cli import commands, schedules


def test_cron_flags_carry_jitter_calendar_and_bounds() -> None:
    args = build_parser().parse_args(
        [
            "jobs", "create", "--name", "n", "--cron", "0 9 * * *", "--timezone", "Europe/Berlin",
            "--jitter-s", "30", "--calendar", "holidays", "--start-at", "2026-01-01T00:00:00Z",
            "--end-at", "2027-01-01T00:00:00Z", "--url-target", "http://127.0.0.1:9/h",
        ]
    )  # fmt: skip
    assert commands._create_body(args)["schedule"] == {
        "cron": "0 9 * * *",
        "timezone": "Europe/Berlin",
        "jitter_s": 30.0,
        "calendar": "holidays",
        "start_at": "2026-01-01T00:00:00Z",
        "end_at": "2027-01-01T00:00:00Z",
    }
    plain = build_parser().parse_args(["jobs", "create", "--cron", "* * * * *"])
    assert commands._create_body(plain)["schedule"] == {"cron": "* * * * *", "timezone": "UTC"}


def test_calendars_create_flags_make_the_calendar_body() -> None:
    args = build_parser().parse_args(
        [
            "calendars", "create", "holidays", "--exclude", "2026-12-25",
            "--exclude", "2026-12-24..2026-12-31", "--exclude-weekday", "sat,sun",
            "--exclude-weekday", "wed", "--timezone", "Europe/Berlin",
        ]
    )  # fmt: skip
    assert schedules.calendar_body(args) == {
        "name": "holidays",
        "exclude": ["2026-12-25", "2026-12-24..2026-12-31"],
        "exclude_weekdays": ["sat", "sun", "wed"],
        "timezone": "Europe/Berlin",
    }
    bare = build_parser().parse_args(["calendars", "create", "empty"])
    assert schedules.calendar_body(bare) == {"name": "empty", "exclude": [], "exclude_weekdays": []}


def test_the_backfill_bar_fills_with_the_done_share() -> None:
    def line(done: int, total: int) -> str:
        return schedules.bar({"done": done, "occurrences": total, "progress": "p"})

    width = schedules.BAR_WIDTH
    assert line(0, 30) == f"[{'.' * width}] p"
    assert line(15, 30) == f"[{'#' * (width // 2)}{'.' * (width // 2)}] p"
    assert line(30, 30) == f"[{'#' * width}] p"
    assert line(0, 0) == f"[{'#' * width}] p"  # nothing to run: done
