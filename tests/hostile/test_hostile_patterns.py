"""Patterns from schemas are matched in linear time, or under a deadline off the event loop (issue 20, point
8): a downstream's ``outputSchema`` pattern ``^(a+)+$`` froze the server 9 s at 28 characters, an operator's
``input_schema`` pattern 4 s at 25. Attacks over HTTP on a real ``mcpipe serve``, ``/healthz`` probed."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from kit.attack import served, write_config
from mcpipe._jsonschema import needs_thread, validator
from mcpipe._pattern import Pattern, compile_pattern
from mcpipe.gateway import PIPE_TOOL
from mcpipe.models import schema_errors

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

DOWNSTREAM = str(Path(__file__).with_name("pattern_downstream.py"))
EVIL = "a" * 28 + "!"


async def test_a_downstreams_catastrophic_output_pattern_is_matched_in_linear_time(tmp_path):
    config = (
        f"mcpServers:\n  evil:\n    command: {sys.executable}\n    args: [{DOWNSTREAM}]\naudit:\n  enabled: false\n"
    )
    async with served(write_config(tmp_path, config)) as server:
        bad, slowest = await server.probed(lambda: server.call("evil.word", {"text": EVIL * 1000}))
        assert bad["isError"] is True
        text = bad["content"][0]["text"]
        assert "invalid structured content returned by tool word" in text and "does not match '^(a+)+$'" in text
        assert slowest < server.stall_s, server.health
        good = await server.call("evil.word", {"text": "aaaa"})
        assert good["structuredContent"] == {"word": "aaaa"}
        piped = await server.call(PIPE_TOOL, {"steps": [{"tool": "evil.word", "args": {"text": EVIL}}]})
        assert "invalid structured content" in piped["structuredContent"]["error"]


DECLARED = """
pipe:
  expression_timeout_ms: 1000
pipelines:
  - name: nested
    input_schema:
      type: object
      properties: {{word: {{type: string, pattern: "^(a+)+$"}}}}
    steps: [{{kind: value, id: v, value: "${{args.word}}"}}]
  - name: lookahead
    input_schema:
      type: object
      properties: {{word: {{type: string, pattern: "^(?=(a+)+$)"}}}}
    steps: [{{kind: value, id: v, value: "${{args.word}}"}}]
  - name: keys
    input_schema:
      type: object
      patternProperties: {{"^(a+)+$": {{type: integer}}}}
      additionalProperties: false
    steps: [{{kind: value, id: v, value: 1}}]
"""


async def test_an_operators_input_schema_patterns_hold_nothing(tmp_path):
    async with served(write_config(tmp_path, DECLARED.format())) as server:
        # Linear: refused at once, a 25 000-character word too.
        nested, slowest = await server.probed(lambda: server.call("nested", {"word": "a" * 25_000 + "!"}))
        assert nested["isError"] is True and "does not match '^(a+)+$'" in nested["content"][0]["text"]
        assert slowest < server.stall_s, server.health
        keys, slowest = await server.probed(lambda: server.call("keys", {"a" * 25 + "!": 1}))
        assert keys["isError"] is True and "does not match any of the regexes" in keys["content"][0]["text"]
        assert slowest < server.stall_s, server.health
        # A lookahead has no linear-time engine: re in a worker, killed at the deadline, off the event loop.
        ahead, slowest = await server.probed(lambda: server.call("lookahead", {"word": "a" * 40 + "!"}))
        assert ahead["isError"] is True
        assert "matching the pattern '^(?=(a+)+$)' took longer than 1000 ms" in ahead["content"][0]["text"]
        assert slowest < server.stall_s, server.health
        fine = await server.call("lookahead", {"word": "aaa"})
        assert fine["isError"] is False


@pytest.mark.parametrize(
    ("pattern", "linear"),
    [
        ("^(a+)+$", True),
        (r"^[A-Z]-\d{3}$", True),
        (r"^\p{L}+$", True),
        ("(?=a)b", False),
        (r"(a)\1", False),
        (r"\Aab\Z", False),
    ],
)
def test_a_pattern_is_linear_unless_it_needs_what_only_a_backtracking_engine_does(pattern, linear):
    assert Pattern(pattern).linear is linear


@pytest.mark.parametrize(
    ("pattern", "texts"),
    [
        ("^(a+)+$", ["", "a", "aaa", "aab", "aaaaaaaaaa!"]),
        ("[0-9]{3}", ["ab123", "12", "x1234y"]),
        ("^A-[0-9]+$", ["A-12", "A-", "B-1"]),
        (r"\bword\b", ["a word here", "swordfish"]),
        ("colou?r", ["color", "colour", "colr"]),
        ("(?=a)a", ["a", "b"]),
        (r"(ab)\1", ["abab", "abba"]),
    ],
)
def test_both_engines_answer_as_re_searches(pattern, texts):
    for text in texts:
        assert compile_pattern(pattern).search(text) is (re.search(pattern, text) is not None), (pattern, text)


def test_schema_validation_with_nested_quantifiers_takes_linear_time():
    schema = {"type": "object", "properties": {"w": {"type": "string", "pattern": "^(a+)+$"}}}
    assert not needs_thread(schema)
    check = validator(schema)  # jsonschema imported: the time below is the match's alone
    t0 = time.perf_counter()
    errors = list(check.iter_errors({"w": "a" * 100_000 + "!"}))
    # backtracking would take longer than anyone waits at 28 characters, at 100 000 for ever: any bound shows it
    assert time.perf_counter() - t0 < 10 and len(errors) == 1
    assert schema_errors({"w": EVIL}, schema) is not None  # a model's structured output is checked the same way
    assert needs_thread({"properties": {"w": {"pattern": "(?<=x)y"}}})
