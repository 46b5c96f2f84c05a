"""An audit record's time is the wall clock to the millisecond, made once a millisecond
(``mcpipe.gateway._now``), and every record is one line written with one ``write``."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import orjson
import pytest

from kit.audit import counted_writes
from mcpipe import gateway
from mcpipe.gateway import AuditLog, Gateway
from mcpipe.tools import ToolContext, ToolRegistry


def _parsed(ts: str) -> float:
    assert ts.endswith("Z") and len(ts) == len("2026-12-04T19:02:39.123Z"), ts
    return datetime.strptime(ts[:-1], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=UTC).timestamp()


def test_an_audit_time_is_the_wall_clock_to_the_millisecond():
    before = time.time()
    ts = gateway._now()
    after = time.time()
    assert before - 0.001 <= _parsed(ts) <= after


@pytest.mark.parametrize(
    ("clock_ms", "expected"),
    [
        ([1_764_875_000_123, 1_764_875_000_123], ["2025-12-04T19:03:20.123Z", "2025-12-04T19:03:20.123Z"]),
        ([1_764_875_000_123, 1_764_875_000_124], ["2025-12-04T19:03:20.123Z", "2025-12-04T19:03:20.124Z"]),
        ([1_764_875_000_999, 1_764_875_001_000], ["2025-12-04T19:03:20.999Z", "2025-12-04T19:03:21.000Z"]),
        ([1_764_892_799_999, 1_764_892_800_007], ["2025-12-04T23:59:59.999Z", "2025-12-05T00:00:00.007Z"]),
        ([1_764_875_000_500, 1_764_875_000_499], ["2025-12-04T19:03:20.500Z", "2025-12-04T19:03:20.499Z"]),
    ],
    ids=["same_millisecond", "next_millisecond", "next_second", "next_day", "clock_stepped_back"],
)
def test_audit_times_move_with_the_clock_and_repeat_only_within_a_millisecond(monkeypatch, clock_ms, expected):
    ticks = iter(ms * 1_000_000 + 400_000 for ms in clock_ms)
    monkeypatch.setattr(gateway.time, "time_ns", lambda: next(ticks))
    monkeypatch.setattr(gateway, "_milli", (-1, ""))
    assert [gateway._now() for _ in clock_ms] == expected


async def test_each_audit_record_is_one_line_written_with_one_write_and_its_time_is_now(tmp_path, monkeypatch):
    writes = counted_writes(monkeypatch)
    tools = ToolRegistry()

    @tools.tool
    def ping(text: str) -> str:
        """Answer the text."""
        return text

    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path))
    gw = Gateway([tools], audit=log)
    before = time.time()
    for i in range(3):
        await gw.call("ping", {"text": f"t{i}"}, ToolContext(request_id=str(i)))
    after = time.time()
    log.close()
    lines = path.read_bytes().splitlines(keepends=True)
    assert writes == lines and len(lines) == 3
    records = [orjson.loads(line) for line in lines]
    assert [r["request_id"] for r in records] == ["0", "1", "2"]
    assert all(before - 0.001 <= _parsed(r["ts"]) <= after for r in records)
    assert [_parsed(r["ts"]) for r in records] == sorted(_parsed(r["ts"]) for r in records)
