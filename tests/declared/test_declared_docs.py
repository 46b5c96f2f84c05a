"""Every step example in docs/declared-pipelines.md compiles, and the ones with an ``# args:`` line run and
give their ``# output:``. (The example configs of examples/declared/ and the doc's config examples are
loaded whole, as the server loads them, in ``test_declared_load.py``.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.declared import run_steps
from mcpipe.backends.sql import SqlBackend, SqlBackendConfig
from mcpipe.declared import CommandPolicy, HttpPolicy, StepPolicy, StepScope, compile_steps
from mcpipe.store.content import ContentStores, MemoryContentStore

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "declared-pipelines.md"
BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
POLICY = StepPolicy(
    http=HttpPolicy(allowed_hosts=["api.example.com"]),
    command=CommandPolicy(commands={"jq": ["/usr/bin/jq", "-c"], "sh": "/bin/sh"}),
    sql={
        "orders": SqlBackend("orders", SqlBackendConfig(url="sqlite://")),  # in memory
        "warehouse": SqlBackend("warehouse", SqlBackendConfig(url="postgresql://postgres@127.0.0.1:1/none")),
    },
    content=ContentStores({"default": MemoryContentStore()}, "default"),
)
TOOLS = frozenset({"search"})


def _blocks() -> list[str]:
    """The doc's step examples (YAML blocks with a top-level ``steps``)."""
    return [b for b in BLOCK.findall(DOC.read_text()) if re.search(r"^steps:", b, re.M)]


def _comment(block: str, name: str) -> Any:
    m = re.search(rf"^# {name}: (.*)$", block, re.M)
    return None if m is None else json.loads(m.group(1))


@pytest.mark.parametrize("block", _blocks(), ids=lambda b: b.split("id: ", 1)[-1].split("\n", 1)[0])
async def test_every_doc_example_compiles_and_the_runnable_ones_give_their_output(block):
    steps, problems = compile_steps(yaml.safe_load(block)["steps"], "steps", StepScope(policy=POLICY, tools=TOOLS))
    assert problems == [], problems
    args = _comment(block, "args")
    if args is not None:
        result = await run_steps(steps, args)
        assert result["ok"], result
        assert result["output"] == _comment(block, "output")


def test_the_doc_documents_every_kind():
    text = DOC.read_text()
    from mcpipe.declared import KIND_STRUCTS

    for kind in (k for k in KIND_STRUCTS if "." not in k):  # a config format documents its own kinds
        assert f"### {kind}\n" in text


def _example_policy(config: dict[str, Any]) -> StepPolicy:
    outbound = config.get("outbound", {})
    return StepPolicy(
        http=HttpPolicy(**outbound.get("http", {})),
        command=CommandPolicy(commands=outbound.get("commands", {})),
    )


async def test_the_order_summary_example_runs():
    config = yaml.safe_load((ROOT / "examples" / "declared" / "order_summary.yaml").read_text())
    steps, problems = compile_steps(config["pipelines"][0]["steps"], "steps", StepScope(policy=_example_policy(config)))
    assert problems == [] and steps is not None
    args = {
        "customer": "ada",
        "currency": "EUR",
        "lines": [{"sku": "a", "qty": 2, "price": 3.5}, {"sku": "b", "qty": 1, "price": 10}],
    }
    result = await run_steps(steps, args)
    assert result["ok"], result
    assert result["output"] == {
        "customer": "ada",
        "currency": "EUR",
        "lines": [{"sku": "a", "qty": 2, "amount": 7.0}, {"sku": "b", "qty": 1, "amount": 10.0}],
        "totals": {"items": 2, "units": 3, "total": 17},
        "summary": "3 units, 17 EUR",
    }
    rejected = await run_steps(steps, {**args, "lines": []})
    assert rejected["error_code"] == "GATE_REJECTED"
