"""``mcpipe explain FILE --format mermaid|dot|svg``: a spec, a declared pipeline and a NoETL playbook drawn as the
console draws them; the README's example and a NoETL playbook (from NoETL's repository) drawn into docs/console/,
checked here to be what the command draws now."""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mcpipe.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "console"
PLAYBOOK = ROOT / "tests" / "formats" / "noetl" / "golden" / "4.26.0" / "conditional_flow.yaml"
SVG = "{http://www.w3.org/2000/svg}"


def _readme_example(tmp_path: Path) -> Path:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```json\n(.*?)```", text, re.S)
    assert block is not None
    path = tmp_path / "readme-example.json"
    path.write_text(block.group(1))
    json.loads(block.group(1))
    return path


def _drawn(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["explain", *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def _shapes(svg: str) -> dict[str, str]:
    """Each drawn step's key and its box's text (its id and what it runs)."""
    root = ET.fromstring(svg.split("?>", 1)[-1])
    out = {}
    for g in root.iter(f"{SVG}g"):
        if "shape" in (g.get("class") or "").split():
            texts = [t.text or "" for t in g.iter(f"{SVG}text")]
            out[g.get("data-key") or ""] = " | ".join(texts)
    return out


def _kept(name: str, drawn: str) -> None:
    """The drawing in docs/console/ is the one the command draws (written again under MCPIPE_CONSOLE_SHOTS)."""
    path = DOCS / name
    if os.environ.get("MCPIPE_CONSOLE_SHOTS"):
        path.write_text(drawn)
    assert path.read_text() == drawn, f"docs/console/{name} is stale: make console-screenshots draws it again"


def test_the_readmes_example_is_drawn_as_svg_mermaid_and_dot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _readme_example(tmp_path)
    svg = _drawn(capsys, str(spec), "--format", "svg")
    assert _shapes(svg) == {
        "search": "search | tool web_search",
        "fetch": "fetch | tool web_fetch",
        "extract": "extract | tool extract_key_info",
    }
    root = ET.fromstring(svg.split("?>", 1)[-1])
    edges = [g for g in root.iter(f"{SVG}g") if "edge" in (g.get("class") or "").split()]
    assert [e.find(f"{SVG}title").text for e in edges] == ["search to fetch", "fetch to extract"]  # type: ignore[union-attr]
    assert root.find(f"{SVG}style") is not None  # a file of its own carries its style
    _kept("readme-example.svg", svg)
    mermaid = _drawn(capsys, str(spec), "--format", "mermaid")
    assert mermaid.splitlines()[0] == "flowchart TB" and "s0 --> s1" in mermaid and "s1 --> s2" in mermaid
    dot = _drawn(capsys, str(spec), "--format", "dot")
    assert dot.startswith('digraph "readme-example" {') and "s0 -> s1;" in dot and "s1 -> s2;" in dot


def test_a_noetl_playbook_is_drawn_with_its_arcs_and_conditions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "mcpipe.yaml"
    config.write_text("outbound:\n  commands:\n    sh: /bin/sh\n")  # its shell steps, as `playbook check` needs
    svg = _drawn(capsys, str(PLAYBOOK), "--format", "svg", "--config", str(config))
    shapes = _shapes(svg)
    assert shapes["start"] == "start | noop" and shapes["prod_setup"] == "prod_setup | shell"
    assert set(shapes) == {"start", "prod_setup", "staging_setup", "dev_setup", "check_deploy", "deploy_app",
                           "verify_deployment", "skip_deploy", "end"}  # fmt: skip
    root = ET.fromstring(svg.split("?>", 1)[-1])
    titles = [
        t.text
        for g in root.iter(f"{SVG}g")
        if "arc" in (g.get("class") or "").split()
        for t in [g.find(f"{SVG}title")]
        if t is not None
    ]
    assert "start to prod_setup when workload.environment == 'production'" in titles
    assert "check_deploy to skip_deploy when workload.deploy != 'true'" in titles
    assert "start to dev_setup" in titles  # the arc with no condition
    _kept("noetl-conditional-flow.svg", svg)
    mermaid = _drawn(capsys, str(PLAYBOOK), "--format", "mermaid", "--config", str(config))
    assert 'subgraph c0["workflow (graph)"]' in mermaid
    assert "s0 -- \"workload.environment == 'production'\" --> s1" in mermaid


def test_a_declared_pipeline_is_drawn_from_its_config(capsys: pytest.CaptureFixture[str]) -> None:
    config = ROOT / "examples" / "declared" / "order_summary.yaml"
    mermaid = _drawn(capsys, "--config", str(config), "--format", "mermaid")
    assert 's0["not_empty<br/><small>cel_gate</small>"]' in mermaid and "s4 --> s5" in mermaid


@pytest.mark.parametrize(
    ("argv", "status", "said"),
    [
        (["--format", "svg"], 2, "the following arguments are required: FILE"),
        (["x.json", "--format", "svg", "--pipeline", "p"], 2, "--pipeline NAME goes with --config FILE"),
        (["x.json", "--config", "c.yaml"], 2, "--config and --pipeline go with --format mermaid|dot|svg"),
    ],
)
def test_explain_refuses_what_it_cannot_draw_in_one_line(
    argv: list[str], status: int, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", *argv]) == status
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_spec_with_problems_is_not_drawn_and_says_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps({"steps": [{"id": "a", "tool": "echo", "args": {"x": "${steps.nope.output}"}}]}))
    assert main(["explain", str(spec), "--format", "svg"]) == 1
    out = capsys.readouterr()
    assert out.out == "" and "steps[0].args.x" in out.err
