"""docs/formats/noetl.md's example runs and answers the JSON the page shows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import trio
import yaml

from kit.noetl import policy
from mcpipe.formats.noetl import compile_noetl, playbook_tool

DOC = Path(__file__).resolve().parents[3] / "docs" / "formats" / "noetl.md"


async def test_the_format_pages_example_answers_what_the_page_says():
    text = DOC.read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    answer = re.search(r"```json\n(.*?)```", text, re.S)
    assert block is not None and answer is not None
    pb, problems = compile_noetl(yaml.safe_load(block.group(1)), policy=policy())
    assert problems == [] and pb is not None, problems
    with trio.fail_after(30):
        got = await playbook_tool(pb).run({})
    assert got["ok"], got["error"]
    assert got["noetl"] == json.loads(answer.group(1))
