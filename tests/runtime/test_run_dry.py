"""``"dry_run": true`` and ``mcpipe explain`` (issue 17): every check, then the plan; nothing runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from mcpipe.cli import main

SPEC: dict[str, Any] = {
    "vars": {"q": "mcp", "n": 3},
    "steps": [
        {"id": "search", "tool": "echo", "args": {"value": {"q": "${vars.q}", "hits": [{"u": "a"}]}}},
        {
            "id": "g",
            "parallel": [
                {"id": "a", "tool": "echo", "args": {"value": "n=${vars.n}"}},
                {"id": "b", "tool": "echo", "args": {"value": "{{search}}"}, "when": "vars.n > 1"},
            ],
        },
        {
            "id": "pages",
            "for_each": "${steps.search.structured.hits}",
            "continue_on_error": True,
            "step": {"tool": "echo", "args": {"value": "${item.u}"}},
        },
    ],
}


async def test_a_dry_run_answers_the_plan_and_calls_nothing(run, probe):
    answer = await run({**SPEC, "dry_run": True})
    assert probe.log == []
    assert answer["ok"] is True and answer["dry_run"] is True and answer["steps"] == {}
    plan = answer["plan"]
    search, group, pages = plan["steps"]
    assert (search["order"], search["tool"], search["args"]) == (
        0,
        "echo",
        {"value": {"q": "mcp", "hits": [{"u": "a"}]}},
    )
    assert group["kind"] == "parallel" and [c["id"] for c in group["parallel"]] == ["a", "b"]
    a, b = group["parallel"]
    assert a["args"] == {"value": "n=3"} and a["known"] == {"steps[1].parallel[0].args.value": 3}
    assert b["when"] == "vars.n > 1"
    assert b["args"] is None
    assert b["pending"] == [{"location": "steps[1].parallel[1].args.value", "reference": "steps.search.output"}]
    assert pages["for_each"] == "steps.search.structured.hits" and pages["continue_on_error"] is True
    assert pages["step"]["pending"] == [{"location": "steps[2].step.args.value", "reference": "item.u"}]


async def test_a_dry_run_still_refuses_what_a_run_would(run, probe):
    bad = {"dry_run": True, "steps": [{"tool": "nope"}, {"tool": "echo", "retry": {"attempts": 2}}]}
    answer = await run(bad)
    assert answer["ok"] is False and "plan" not in answer
    assert [p["location"] for p in answer["problems"]] == ["steps[0].tool"]
    refused = await run({"dry_run": True, "steps": [{"tool": "echo", "retry": {"attempts": 2}}]})
    assert [p["location"] for p in refused["problems"]] == ["steps[0].retry"]
    nested = await run({"steps": [{"pipe": {"dry_run": True, "steps": [{"tool": "echo"}]}}]})
    assert [(p["location"], p["message"]) for p in nested["problems"]] == [
        ("steps[0].pipe.dry_run", "`dry_run` applies to the whole call: set it at the top level")
    ]
    assert probe.log == []


def test_mcpipe_explain_prints_the_plan_of_a_file(tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]):
    path = tmp_path / "p.json"
    path.write_bytes(orjson.dumps(SPEC))
    assert main(["explain", str(path)]) == 0
    answer = orjson.loads(capsysbinary.readouterr().out)
    assert answer["dry_run"] is True
    assert [s["id"] for s in answer["plan"]["steps"]] == ["search", "g", "pages"]


def test_mcpipe_explain_reports_problems_located(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "p.json"
    path.write_bytes(orjson.dumps({"steps": [{"tool": "echo", "when": "${vars.nope}"}]}))
    assert main(["explain", str(path)]) == 1
    assert "p.json: steps[0].when: reference `vars.nope`: no var named 'nope' [INVALID_SPEC]" in capsys.readouterr().err
