"""Hypothesis-generated specs, templates and configs: never a crash, never a second, only mcpipe's errors.

Quick in the normal suite (profile ``hostile``); ``make fuzz`` runs the same properties long (profile
``fuzz``, ``MCPIPE_FUZZ_EXAMPLES`` examples each).
"""

from __future__ import annotations

import json
import os
from typing import Any

import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st

import mcpipe.declared  # noqa: F401  (imports JSONata, which raises the recursion limit, before hypothesis runs)
from mcpipe import Template
from mcpipe.compile import Limits, compile_spec
from mcpipe.config import parse_config
from mcpipe.errors import ConfigError, InterpolationError, MCPipeError, OutputTooLargeError, SpecError
from mcpipe.runtime import run_pipeline
from mcpipe.tools.builtin import builtin_tools

PROFILE = settings.get_profile(os.environ.get("MCPIPE_FUZZ_PROFILE", "hostile"))
CODES = {
    None,
    "INVALID_SPEC",
    "UNKNOWN_TOOL",
    "LIMIT_EXCEEDED",
    "INTERPOLATION_FAILED",
    "TOOL_ERROR",
    "TOOL_FAILED",
    "OUTPUT_TOO_LARGE",
    "TIMEOUT",
    "FORBIDDEN",
}
LIMITS = Limits(max_steps=30, max_spec_bytes=200_000, max_output_bytes=100_000, max_answer_bytes=300_000)

# Pieces that make templates interesting: openers, escapes, roots, paths, brackets, stars.
FRAGMENTS = [
    "${", "}", "{{", "}}", "$<", ">", "<<", ">>", "\\${", "\\{{", "vars.", "steps.", "last", "args.", "context.",
    "step1", "step2", "a", "b.output", "[0]", "[-1]", "[*]", "['k']", '["k"]', ".", "*", "structured.v", " ",
    "é", "\x00", "\n", "${vars.v}", "${steps.a.structured}", "{{step1.v}}", "${last.output}", "$ref",
]  # fmt: skip
template_text = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=12).map("".join)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | template_text
KEYS = st.sampled_from(["a", "b", "v", "$ref", "$literal", "k"])
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["a", "b", "v", "$ref", "$literal", "k"]) | st.text(max_size=3), inner, max_size=4
        )
    ),
    max_leaves=20,
)
tool_names = st.sampled_from(["echo", "text_join", "json_parse", "json_dump", "text_split", "nope", "mcp_pipe"])
step_ids = st.none() | st.sampled_from(["a", "b", "step1", "step2", "step9", "bad id", ""])


def steps_of(children: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(children, min_size=0, max_size=4)


def step_strategy() -> st.SearchStrategy[Any]:
    leaf = st.fixed_dictionaries(
        {"tool": tool_names}, optional={"id": step_ids, "args": json_values, "timeout_ms": st.floats(-1, 100)}
    )
    return st.recursive(
        leaf | json_scalars,
        lambda inner: (
            st.fixed_dictionaries({"parallel": steps_of(inner)}, optional={"id": step_ids})
            | st.fixed_dictionaries(
                {"pipe": st.fixed_dictionaries({"steps": steps_of(inner)}, optional={"vars": json_values})},
                optional={"id": step_ids},
            )
        ),
        max_leaves=10,
    )


specs = st.fixed_dictionaries(
    {"steps": steps_of(step_strategy())},
    optional={
        "vars": st.dictionaries(st.sampled_from(["v", "w"]), json_values, max_size=2) | json_values,
        "return": json_values,
        "continue_on_error": st.booleans() | json_scalars,
        "timeout_ms": st.floats(-1, 1000) | json_scalars,
        "extra": json_values,
    },
)


@settings(PROFILE)
@given(spec=specs | json_values)
@example(spec={"0": None})  # found by the fuzzer: a numeric key beside "steps" made the problems unsortable
def test_compiling_any_spec_answers_a_plan_or_a_spec_error(spec):
    try:
        compile_spec(spec, tools={"echo", "text_join", "json_parse", "json_dump", "text_split"}, limits=LIMITS)
    except SpecError as e:
        assert e.problems and all(p.code in CODES for p in e.problems)


@settings(PROFILE)
@given(spec=specs)
def test_running_any_spec_answers_a_section_7_object(spec):
    async def main() -> dict[str, Any]:
        with trio.fail_after(5):
            return await run_pipeline(spec, builtin_tools(), limits=LIMITS)

    answer = trio.run(main)
    assert isinstance(answer["ok"], bool) and answer["error_code"] in CODES
    json.dumps(answer)  # always JSON


@settings(PROFILE)
@given(value=json_values, env_vars=json_values)
def test_any_template_compiles_or_is_a_syntax_error_and_resolves_or_is_an_mcpipe_error(value, env_vars):
    try:
        t = Template(value, step_ids=["a", "b"], location="args", max_text_bytes=10_000)
    except MCPipeError:
        return
    env = {"vars": {"v": env_vars}, "steps": {"a": {"output": env_vars, "structured": env_vars}}, "last": None}
    try:
        t.resolve({**env, "args": {}, "context": {}})
    except (InterpolationError, OutputTooLargeError):
        pass


config_sections = st.fixed_dictionaries(
    {},
    optional={
        "name": json_scalars,
        "pipe": st.dictionaries(
            st.sampled_from(["max_steps", "max_json_depth", "max_output_bytes", "nope"]), json_scalars
        ),
        "http": st.dictionaries(st.sampled_from(["port", "body_timeout_s", "max_body_bytes", "path"]), json_scalars),
        "interaction": st.dictionaries(
            st.sampled_from(["max_suspended", "max_suspended_bytes", "state_ttl_s"]), json_scalars
        ),
        "pipelines": st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["p", "q", "mcp_pipe", ""]), "steps": st.lists(json_values, max_size=3)},
                optional={"output": json_values, "input_schema": json_values},
            ),
            max_size=2,
        )
        | json_values,
        "mcpServers": json_values,
        "costs": json_values,
    },
)


@settings(PROFILE)
@given(doc=config_sections)
def test_any_config_loads_or_is_a_config_error(doc):
    try:
        parse_config(json.dumps(doc), "json", environ={})
    except ConfigError as e:
        assert e.problems
