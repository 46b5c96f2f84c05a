"""The conformance harness's bookkeeping (the suite itself runs in ``make conformance``)."""

from __future__ import annotations

import pytest

from conformance import harness


@pytest.fixture(autouse=True)
def one_pending(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pending scenario of the tests' own (whatever the harness lists today)."""
    monkeypatch.setattr(harness, "PENDING", {"server-sse-polling": "12.6"})


def test_a_check_passing_directly_and_failing_through_mcpipe_is_lost_unless_its_scenario_is_pending():
    direct = {("tools-list", "a"): "SUCCESS", ("server-sse-polling", "b"): "SUCCESS", ("ping", "c"): "FAILURE"}
    through = {("tools-list", "a"): "FAILURE", ("server-sse-polling", "b"): "INFO", ("ping", "c"): "FAILURE"}
    report = harness.Report()
    harness.compare(report, "[http 2025-11-25]", direct, through)
    assert report.lost == ["[http 2025-11-25] tools-list/a: FAILURE"]
    assert report.pending_lost == ["[http 2025-11-25] server-sse-polling/b: INFO (issue 12.6)"]
    assert (report.passed, report.total) == (0, 2) and not report.ok()


def test_a_pending_scenario_that_passes_everywhere_fails_the_run_until_its_entry_goes():
    direct = {("server-sse-polling", "b"): "SUCCESS"}
    report = harness.Report()
    harness.compare(report, "[http 2025-11-25]", direct, {("server-sse-polling", "b"): "SUCCESS"})
    harness.compare(report, "[stdio 2025-11-25]", direct, {("server-sse-polling", "b"): "SUCCESS"})
    assert report.stale() == ["server-sse-polling"] and not report.ok()
    still_failing = harness.Report()
    harness.compare(still_failing, "[http 2025-11-25]", direct, {("server-sse-polling", "b"): "SUCCESS"})
    harness.compare(still_failing, "[stdio 2025-11-25]", direct, {})
    assert still_failing.stale() == [] and still_failing.ok()


def test_a_run_with_fewer_passing_checks_than_its_floor_or_a_listed_scenario_missing_fails_naming_them():
    direct = {("tools-list", "a"): "SUCCESS", ("ping", "b"): "SUCCESS", ("ping", "c"): "FAILURE"}
    report = harness.Report()
    harness.compare(report, "[http 2025-11-25]", direct, direct)
    assert report.ok()  # everything that passed directly passed through: compare alone is satisfied
    harness.floor(report, "[direct 2025-11-25]", direct, 3, {"tools-list", "ping", "prompts-list"})
    assert report.lost == [
        "[direct 2025-11-25] prompts-list: no checks ran (the suite lists it)",
        "[direct 2025-11-25]: only 2 checks passed, at least 3 expected "
        "(the floor in tests/conformance/harness.py; 3 ran)",
    ]
    assert not report.ok()
    enough = harness.Report()
    harness.floor(enough, "[direct 2025-11-25]", direct, 2, {"tools-list", "ping"})
    assert enough.ok()


def test_the_floors_cover_every_era_and_are_not_zero():
    assert set(harness.DIRECT_FLOOR) == set(harness.ERAS) and min(harness.DIRECT_FLOOR.values()) > 0
    assert 2 * len(harness.ALONE) <= harness.ALONE_FLOOR and harness.TASKS_FLOOR > 0
