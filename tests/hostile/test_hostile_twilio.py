"""The ``twilio`` kind's ``stage_call_response`` under a hostile caller (issue 27, item 10), against a real
``mcpipe serve``: verbs staged for Twilio's inbound-voice webhook, which mcpipe does not serve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from kit.attack import served, write_config

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


def _config(operation: str) -> dict[str, Any]:
    step = {
        "id": "tw",
        "kind": "twilio",
        "operation": operation,
        "account_sid": "AC" + "0" * 32,
        "auth_token": "token",
    }
    return {"audit": {"enabled": False}, "pipelines": [{"name": "stage", "steps": [step]}]}


async def test_a_step_staging_call_responses_no_route_serves_is_refused_when_the_config_loads(tmp_path: Path) -> None:
    # Before: `stage_call_response` kept the caller's verbs for a webhook mcpipe does not serve, bounded by
    # count only (10 000), for the caller's `ttl_secs`: 60 calls of 2 MB of verbs each left the server 120 MB
    # larger for good (nothing ever took them, nothing expired them but a take).
    config = write_config(tmp_path, json.dumps(_config("stage_call_response")), ".json")
    with pytest.raises(RuntimeError) as exited, trio.fail_after(60):
        async with served(config):
            pass
    text = str(exited.value)
    assert "pipelines.stage.steps[0].operation" in text and "inbound-voice webhook" in text, text
    assert "Traceback" not in text
    build = write_config(tmp_path, json.dumps(_config("build_twiml")), ".json")  # the local operation still works
    async with served(build) as server:
        answer, slowest = await server.probed(
            lambda: server.call("stage", {"twiml_verbs": [{"verb": "say", "text": "x" * 2_000_000}]})
        )
    assert slowest < server.stall_s, server.health
    assert answer["structuredContent"]["twiml"].endswith("</Say></Response>")
