"""discord-mcp's ``mcp_pipeline`` (``formats/discord``) under a hostile caller: its ``{{...}}`` interpolation
scanned in linear time, the references of one call bounded, ``save_as`` variables within the answer's
bound. Over HTTP against a real ``mcpipe serve``, ``/healthz`` probed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kit.attack import Served, served, write_config
from mcpipe.formats.discord._steps import MAX_REFERENCES, PIPELINE_TOOL, _placeholders

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

CONFIG = """
audit: {enabled: false}
pipe: {mcp_pipeline: true, max_answer_bytes: 8388608}
pipelines:
  - name: said
    steps: [{kind: value, id: v, value: "${args}"}]
"""


async def _pipeline(server: Served, steps: list[dict[str, Any]]) -> tuple[dict[str, Any], float]:
    return await server.probed(lambda: server.call(PIPELINE_TOOL, {"steps": steps}))


async def test_mcp_pipelines_interpolation_holds_no_event_loop_and_its_variables_stay_bounded(tmp_path):
    async with served(write_config(tmp_path, CONFIG)) as server:
        # Before: `{{` without `}` made the placeholder regex scan to the end from each `{{`: 40 KB of it held
        # the event loop 7.1 s (4 MB: hours).
        opened, slowest = await _pipeline(server, [{"tool": "said", "args": {"x": "{{" * 20_000}}])
        assert opened["isError"] is False and opened["structuredContent"]["steps"][0]["status"] == "success"
        assert slowest < server.stall_s, server.health
        # Before: 400 000 references (2 MB) held the event loop 2.3 s building 57 MB of problems (unbound),
        # or 5 s and 120 MB compiling them (bound).
        for steps in (
            [{"tool": "said", "args": {"x": "{{a}}" * 400_000}}],
            [{"id": "a", "tool": "said", "args": {"x": "v"}}, {"tool": "said", "args": {"y": "{{a.x}}" * 400_000}}],
        ):
            refused, slowest = await _pipeline(server, steps)
            assert slowest < server.stall_s, server.health
            text = refused["content"][0]["text"]
            assert text.startswith("**Pipeline rejected** (INTERPOLATION_FAILED)")
            assert f"more than {MAX_REFERENCES} `{{{{...}}}}` references in one call" in text
            assert len(json.dumps(refused)) < 4096
        # A few MB of text scanned off the event loop.
        scanned, slowest = await _pipeline(server, [{"tool": "said", "args": {"x": "{{a}" * 500_000}}])
        assert scanned["isError"] is False
        assert slowest < server.stall_s, server.health
        # References up to the bound work as before.
        fine = await server.call(
            PIPELINE_TOOL,
            {"steps": [{"id": "a", "tool": "said", "args": {"x": 7}}, {"tool": "said", "args": {"y": "{{a.x}}"}}]},
        )
        assert fine["structuredContent"]["steps"][1]["result"] == {"y": 7}
        # Holds: 20 steps each saving a doubled 1 MB value; the answer holds every variable, so the run stops
        # at pipe.max_answer_bytes (here 8 MiB) instead of growing to 2^19 MB.
        steps: list[dict[str, Any]] = [{"id": "s0", "tool": "said", "args": {"x": "v" * 1_000_000}}]
        steps += [
            {"tool": "said", "args": {"x": f"{{{{s{i - 1}.x}}}}{{{{s{i - 1}.x}}}}"}, "save_as": f"s{i}"}
            for i in range(1, 20)
        ]
        before = server.rss_mb()
        answer, slowest = await _pipeline(server, steps)
        assert slowest < server.stall_s, server.health
        assert answer["structuredContent"]["aborted"] is True
        assert len(json.dumps(answer)) < 10 * 1024 * 1024
        assert server.rss_mb() - before < 200
        assert server.alive and "Traceback" not in server.text()


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("{{a}}", [(0, 5, "a")]),
        ("x{{a.b[0]}}y{{c}}", [(1, 11, "a.b[0]"), (12, 17, "c")]),
        ("{{}}{{a}}", [(4, 9, "a")]),
        ("{{{a}}", [(0, 6, "{a")]),
        ("{{a}b}}", []),
        ("{{a}{{b}}", [(4, 9, "b")]),
        ("{{\n}}", [(0, 5, "\n")]),
    ],
)
def test_placeholders_are_found_as_discords_regex_finds_them(text, found):
    assert [(p.start, p.end, p.inner) for p in _placeholders(text)] == found
