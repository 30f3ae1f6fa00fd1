"""The HTTP benchmarks' sink and bookkeeping: request parsing, records, lateness, lost and
duplicates, and the /proc CPU readings.

No broker, no database: the sink runs as the benchmark runs it (a child process on
127.0.0.1), the rest is the arithmetic behind bench/results/http-rate-*.json.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from bench.cpu import CpuMeter, per_job, pid_listening, tree_cpu_s
from bench.sink import Sink, SinkProtocol, Store, delivery_figures, record_of


class _Transport:
    def __init__(self) -> None:
        self.out = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True


def _protocol() -> tuple[SinkProtocol, _Transport]:
    proto = SinkProtocol(Store())
    transport = _Transport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    return proto, transport


def _body(seq: int, scheduled_at: str = "2026-12-01T10:00:00.000Z", key: str = "k") -> bytes:
    doc = {"job_id": "j", "execution_id": key, "attempt": 1, "scheduled_at": scheduled_at,
           "payload": {"seq": seq}}  # fmt: skip
    body = json.dumps(doc).encode()
    head = f"POST /hook HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {key}\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def test_pipelined_and_split_requests_are_each_answered_and_recorded() -> None:
    proto, transport = _protocol()
    stream = _body(0, key="a") + _body(1, key="b") + _body(2, key="c")
    proto.data_received(stream[:10])
    assert transport.out == b""  # nothing complete yet
    proto.data_received(stream[10:-5])
    proto.data_received(stream[-5:])
    assert transport.out.count(b"HTTP/1.1 200 OK") == 3
    assert [key for _, key, *_ in proto.store.raw] == ["a", "b", "c"]
    assert not transport.closed


def test_malformed_requests_are_refused_and_the_connection_closed() -> None:
    cases = {
        b"NONSENSE\r\n\r\n": b"400",
        b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n": b"400",
        b"POST / HTTP/1.1\r\nno colon\r\n\r\n": b"400",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n": b"411",
        b"POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n": b"413",
    }
    for request, status in cases.items():
        proto, transport = _protocol()
        proto.data_received(request)
        assert transport.out.startswith(b"HTTP/1.1 " + status), request
        assert transport.closed
        assert proto.store.raw == [] and proto.store.rejected == 1


def test_control_paths_count_and_dump() -> None:
    proto, transport = _protocol()
    proto.data_received(_body(0) + b"GET /_sink/count HTTP/1.1\r\n\r\n")
    assert transport.out.endswith(b"\r\n\r\n1")
    proto.data_received(b"GET /_sink/records HTTP/1.1\r\n\r\n")
    last = transport.out.rsplit(b"\r\n\r\n", 1)[1]
    assert json.loads(last)["seq"] == 0
    assert len(proto.store.raw) == 1  # control requests are not deliveries


def test_record_of_keeps_a_bad_body_as_an_error() -> None:
    assert "error" in record_of(1, "k", "POST", "/", b"not json")
    assert "error" in record_of(1, "k", "POST", "/", b'{"scheduled_at": "2026-12-01T10:00:00"}')
    assert "error" in record_of(1, "k", "POST", "/", b"[1]")
    good = record_of(5_000_000, "k", "POST", "/", _body(3).split(b"\r\n\r\n", 1)[1])
    assert good["seq"] == 3 and good["arrival_ms"] == 5.0
    assert good["scheduled_at_ms"] == 1_796_119_200_000.0


def _rec(seq: int, key: str, arrival_ms: float, scheduled_ms: float) -> dict[str, Any]:
    return {"seq": seq, "key": key, "arrival_ms": arrival_ms, "scheduled_at_ms": scheduled_ms}


def test_delivery_figures_lateness_lost_duplicates() -> None:
    records = [
        _rec(0, "a", 1010.0, 1000.0),
        _rec(1, "b", 1030.0, 1010.0),
        _rec(1, "b", 1500.0, 1010.0),  # the same key again: a duplicate
        _rec(7, "z", 1000.0, 1000.0),  # not a job of this run
        {"error": "bad body", "arrival_ms": 1.0, "key": ""},
    ]
    f = delivery_figures(records, range(3), 1000.0)
    assert f["arrived"] == 2 and f["lost"] == 1 and f["duplicates"] == 1
    assert f["malformed_deliveries"] == 2
    assert f["lateness_ms"] == {"p50": 10.0, "p99": 20.0, "max": 20.0}
    assert f["throughput_jobs_per_s"] == round(2 / 0.03, 1)


def test_lateness_counts_from_the_planned_due_time_when_given() -> None:
    # created 5 s after its planned due time: run at once, with scheduled_at = its creation
    records = [_rec(0, "a", 6020.0, 6000.0)]
    planned = delivery_figures(records, range(1), 1000.0, lambda seq: 1000.0 + seq)
    assert planned["lateness_ms"]["p50"] == 5020.0
    assert planned["lateness_vs_scheduled_at_ms"]["p50"] == 20.0
    assert delivery_figures(records, range(1), 1000.0)["lateness_ms"]["p50"] == 20.0


@given(
    arrivals=st.lists(
        st.tuples(st.integers(0, 30), st.integers(0, 3), st.floats(0, 1e6)), max_size=80
    ),
    expected=st.integers(0, 20),
)
def test_delivery_figures_account_for_every_job(
    arrivals: list[tuple[int, int, float]], expected: int
) -> None:
    records = [_rec(seq, f"{seq}-{variant}", 1000.0 + late, 1000.0)
               for seq, variant, late in arrivals]  # fmt: skip
    f = delivery_figures(records, range(expected), 1000.0)
    in_run = [r for r in records if r["seq"] < expected]
    assert f["arrived"] + f["lost"] == expected
    assert f["arrived"] == len({r["seq"] for r in in_run})
    assert f["duplicates"] == len(in_run) - len({r["key"] for r in in_run})
    assert f["malformed_deliveries"] == len(records) - len(in_run)
    if f["arrived"]:
        lat = f["lateness_ms"]
        assert lat["p50"] <= lat["p99"] <= lat["max"]
        # a job's lateness is its first arrival's
        firsts: dict[int, float] = {}
        for r in in_run:
            firsts[r["seq"]] = min(firsts.get(r["seq"], 1e18), r["arrival_ms"] - 1000.0)
        assert lat["max"] == round(max(firsts.values()), 1)


def test_sink_process_records_deliveries_and_writes_them_on_stop(tmp_path: Path) -> None:
    with Sink(tmp_path, "t") as sink:
        conn = http.client.HTTPConnection("127.0.0.1", sink.port, timeout=10)
        for seq in range(3):  # one keep-alive connection
            body = _body(seq, key=f"k{seq}").split(b"\r\n\r\n", 1)[1]
            conn.request("POST", "/hook", body=body, headers={"Idempotency-Key": f"k{seq}"})
            response = conn.getresponse()
            response.read()
            assert response.status == 200
        conn.request("POST", "/hook", body=b"x", headers={"Content-Length": "nope"})
        assert conn.getresponse().status == 400
        assert sink.count() == 3
    assert [r["key"] for r in sink.records] == ["k0", "k1", "k2"]
    assert all(r["arrival_ms"] <= time.time() * 1000 for r in sink.records)
    assert sink.proc is not None and sink.proc.returncode == 0


def test_cpu_readings_of_a_process_tree_and_a_listener() -> None:
    before = tree_cpu_s(os.getpid())
    assert before is not None
    meter = CpuMeter({"me": os.getpid(), "gone": 2**22 + 12345})
    meter.start()
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # burn a little CPU
        pass
    meter.stop()
    seconds = meter.seconds()
    assert seconds["me"] is not None and seconds["me"] >= 0.1
    assert seconds["gone"] is None
    assert per_job({"a": 1.0, "b": None, "gen": 5.0}, 4, exclude=("gen",)) == {
        "system_cpu_s": 1.0,
        "cpu_ms_per_job": 250.0,
    }
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert pid_listening(listener.getsockname()[1]) == os.getpid()
