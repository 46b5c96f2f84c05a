"""Every vendored NoETL playbook (``upstream/``, 336 files from noetl/noetl's history) checked by mcpipe: the
ones it takes compile into a plan, the others are refused with reasons located in the file, and the table
of refusals in docs/playbooks.md is what the check finds (``scripts/noetl_corpus.py`` writes it)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from mcpipe.formats.noetl import NoetlPlaybook, load_playbook

ROOT = Path(__file__).resolve().parents[3]
LOCATED = re.compile(r"^(?P<file>[^:]+\.ya?ml):(?P<line>\d+)(: (?P<where>\S+))?: \S")


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("noetl_corpus", ROOT / "scripts" / "noetl_corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("noetl_corpus", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def corpus() -> tuple[ModuleType, list[tuple[str, list[str]]]]:
    script = _script()
    return script, script.check_corpus()


def test_every_vendored_playbook_is_checked_and_a_refused_one_says_why_located_in_its_file(corpus):
    _, results = corpus
    assert len(results) == 336
    refused = [(rel, problems) for rel, problems in results if problems]
    for rel, problems in refused:
        for line in problems:
            m = LOCATED.match(line)
            assert m is not None, line  # FILE:LINE: where: why, one line
            assert m.group("file") == rel and "\n" not in line
    passed = len(results) - len(refused)
    assert passed >= 278, passed  # see docs/playbooks.md for the table of the rest


def test_the_docs_table_of_refused_playbooks_is_what_the_check_finds(corpus):
    script, results = corpus
    assert script.current() == script.table(results), "stale: run `python scripts/noetl_corpus.py`"


def test_a_playbook_that_passes_compiles_into_one_graph_of_its_steps(corpus):
    script, results = corpus
    passed = [rel for rel, problems in results if not problems]
    known = script.catalog()
    for rel in passed[::16]:  # a sample across the corpus
        pb, problems = load_playbook(rel, base_dir=str(script.UPSTREAM), policy=script.policy(), known=known)
        assert problems == [] and pb is not None
        if isinstance(pb, NoetlPlaybook):
            assert pb.plan is not None
            (graph,) = pb.plan.plan.steps
            assert graph.kind == "graph"
            # a node per step (a loop step's `save` is a node of its own after the loop: `STEP.save`)
            assert {n.id.removesuffix(".save") for n in graph.nodes} <= set(pb.steps)


@pytest.mark.parametrize(
    ("rel", "reason"),
    [
        (
            "examples/snowflake/snowflake_simple.yaml",
            "workflow[0].kind: NoETL tool kind `snowflake` (a cloud warehouse) has no mcpipe step kind",
        ),
        (
            "automation/iap/gcp/test_rhai.yaml",
            "workflow[0].tool.kind: NoETL tool kind `rhai` (the Rhai scripting engine) has no mcpipe step kind",
        ),
        ("conf/sample-demo.yaml", "workflow: a workflow of NoETL's 2018 Go prototype, which ran none"),
        ("workflows/time/fetch-current-time.yaml", "workflow: a workflow of NoETL's 2023 NATS prototype, which ran"),
    ],
)
def test_a_kind_or_shape_mcpipe_does_not_have_is_refused_at_check_time_naming_it(corpus, rel: str, reason: Any):
    _, results = corpus
    problems = dict(results)[rel]
    assert any(reason in p for p in problems), problems
