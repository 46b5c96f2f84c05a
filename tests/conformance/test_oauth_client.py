"""mcpipe's downstream connection as the conformance suite's OAuth client, on a few of its ``auth/*``
scenarios (``make conformance`` runs them all, each era: mode ``oauth`` of ``harness.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio

from conformance.harness import NOT_TAKEN, OAUTH_CLIENT, oauth_scenarios, suite

SAMPLE = [
    ("auth/basic-cimd", "2026-07-28"),
    ("auth/scope-step-up", "2025-11-25"),
    ("auth/iss-wrong-issuer", "2026-07-28"),
    ("auth/client-credentials-jwt", None),
]


@pytest.mark.parametrize(("scenario", "version"), SAMPLE)
async def test_mcpipes_downstream_connection_passes_the_suites_oauth_client_scenario(
    scenario: str, version: str | None, tmp_path: Path
):
    args = [*suite(), "client", "--command", f"{sys.executable} {OAUTH_CLIENT}", "--scenario", scenario]
    args += ["-o", str(tmp_path)] + (["--spec-version", version] if version else [])
    with trio.fail_after(180):
        await trio.run_process(args, capture_stdout=True, capture_stderr=True, check=False)
    checks = [c for f in await trio.Path(tmp_path).rglob("checks.json") for c in json.loads(await f.read_text())]
    scored = [c for c in checks if c["status"] not in ("INFO", "SKIPPED")]
    assert len(scored) >= 5 or scenario == "auth/iss-wrong-issuer", checks
    assert all(c["status"] == "SUCCESS" for c in scored), [c for c in scored if c["status"] != "SUCCESS"]


def test_every_scenario_a_gateway_does_not_take_part_in_is_one_the_suite_has_and_says_why():
    listed = {s for s, _ in oauth_scenarios()}
    assert set(NOT_TAKEN) <= listed
    assert all(len(why) > 40 for why in NOT_TAKEN.values())
