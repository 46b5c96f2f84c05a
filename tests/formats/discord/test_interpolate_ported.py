"""discord-mcp's ``pipeline/interpolate.test.ts``, every case ported: each test names the upstream case
(``upstream/cappyeo/packages/mcp-core/src/pipeline/interpolate.test.ts``).

Upstream calls ``resolvePath``, ``interpolate`` and ``evalCondition`` on a variables object. Here each
variable is the answer of an earlier step of that name (discord's variables are its steps' results), the
expression goes into the arguments (or the ``if``) of a last step, ``probe``, and the test reads what
``probe``'s tool received, through mcpipe's ``mcp_pipeline`` over the SDK's client.

Where mcpipe differs on purpose (a reference that cannot resolve is ``INTERPOLATION_FAILED``, as seed 001
documents, where discord's code leaves ``undefined`` or the literal placeholder), the test says so and
asserts mcpipe's behaviour; ``docs/formats/discord.md`` gives the reasons.
"""

from __future__ import annotations

from typing import Any

from kit.discord import err
from mcpipe.tools import ToolResult

PATH_VARS = {"step1": {"id": "msg_123", "author": {"name": "alice"}, "items": ["a", "b", "c"]}, "counter": 5}
INTERPOLATE_VARS = {"step1": {"id": "msg_123", "count": 5}, "step2": {"url": "https://example.com"}}
CONDITION_VARS = {"step1": {"has_items": True, "count": 0, "name": ""}, "step2": {"count": 5}}


async def run(pipeline, standins, variables: dict[str, Any], args: Any = None, **probe: Any) -> tuple[Any, Any]:
    """Steps named after ``variables`` answering their values, then ``probe`` with ``args`` (and ``if``...):
    the answer, and the arguments ``probe``'s tool received (None when it was not called)."""
    steps = []
    for name, value in variables.items():
        standins.respond("x", ToolResult([{"type": "text", "text": "ok"}], value))
        steps.append({"id": name, "tool": "x", "args": {}})
    steps.append({"id": "probe", "tool": "fake_tool_1", "args": {"v": args} if args is not None else {}, **probe})
    answer = (await pipeline({"steps": steps})).structured_content
    received = [a for name, a in standins.calls if name == "fake_tool_1"]
    return answer, (received[0].get("v") if received else None)


def failed(answer: dict[str, Any]) -> dict[str, Any]:
    """The ``probe`` step's error (the step must have failed)."""
    probe = next(s for s in answer["steps"] if s["id"] == "probe")
    assert probe["status"] == "error", probe
    return probe["error"]


# --- resolvePath ------------------------------------------------------------------------------------------


async def test_resolves_a_simple_key(pipeline, standins):
    # upstream: resolvePath 'resolves a simple key'
    _, v = await run(pipeline, standins, PATH_VARS, "{{counter}}")
    assert v == 5


async def test_resolves_a_nested_object_path_with_dots(pipeline, standins):
    # upstream: resolvePath 'resolves a nested object path with dots'
    _, v = await run(pipeline, standins, PATH_VARS, ["{{step1.id}}", "{{step1.author.name}}"])
    assert v == ["msg_123", "alice"]


async def test_resolves_an_array_index_with_bracket_notation(pipeline, standins):
    # upstream: resolvePath 'resolves an array index with bracket notation'
    _, v = await run(pipeline, standins, PATH_VARS, ["{{step1.items[0]}}", "{{step1.items[2]}}"])
    assert v == ["a", "c"]


async def test_a_missing_path_fails_its_step_with_interpolation_failed(pipeline, standins):
    # upstream: resolvePath 'returns undefined for a missing path'. mcpipe: INTERPOLATION_FAILED (seed 001),
    # at the step for a missing path into a result, before anything runs for a name no step has.
    answer, v = await run(pipeline, standins, PATH_VARS, "{{step1.missing}}")
    assert v is None and answer["aborted"] is True
    error = failed(answer)
    assert error["code"] == "INTERPOLATION_FAILED"
    assert error["message"] == (
        "steps.2.args.v: cannot resolve `{{step1.missing}}`: `missing` not found in object with 3 keys: "
        '"id", "author", "items"'
    )
    standins.calls.clear()
    answer, _ = await run(pipeline, standins, PATH_VARS, "{{absent.path}}")
    assert standins.calls == []  # nothing ran
    assert failed(answer)["code"] == "INTERPOLATION_FAILED"
    assert "`{{absent.path}}` names no earlier step" in failed(answer)["message"]
    assert [s["status"] for s in answer["steps"]] == ["skipped", "skipped", "error"]


async def test_a_path_through_a_missing_value_fails_its_step_with_interpolation_failed(pipeline, standins):
    # upstream: resolvePath 'returns undefined for a path that goes through null/undefined'
    answer, v = await run(pipeline, standins, PATH_VARS, "{{step1.author.deep.deeper}}")
    assert v is None
    assert failed(answer)["code"] == "INTERPOLATION_FAILED"
    assert "`deep` not found" in failed(answer)["message"]


# --- interpolate ------------------------------------------------------------------------------------------


async def test_returns_raw_value_type_preserved_when_entire_string_is_a_single_template(pipeline, standins):
    # upstream: interpolate 'returns raw value (type-preserved) when entire string is a single template'
    _, v = await run(pipeline, standins, INTERPOLATE_VARS, ["{{step1.id}}", "{{step1.count}}"])
    assert v == ["msg_123", 5]
    assert isinstance(v[1], int)


async def test_stringifies_and_concatenates_multi_template_strings(pipeline, standins):
    # upstream: interpolate 'stringifies and concatenates multi-template strings'
    _, v = await run(
        pipeline, standins, INTERPOLATE_VARS, ["count is {{step1.count}}", "{{step1.id}} at {{step2.url}}"]
    )
    assert v == ["count is 5", "msg_123 at https://example.com"]


async def test_a_missing_variable_in_a_mixed_string_is_refused_before_anything_runs(pipeline, standins):
    # upstream: interpolate 'leaves missing variables as the literal placeholder in mixed strings'. mcpipe:
    # the literal braces would be posted to Discord (discord's own docs warn of it); refused, as seed 001 says.
    answer, v = await run(pipeline, standins, INTERPOLATE_VARS, "hello {{absent.var}}")
    assert v is None and standins.calls == []
    assert failed(answer) == {
        "code": "INTERPOLATION_FAILED",
        "message": "steps.2.args.v: `{{absent.var}}` names no earlier step (an id, a save_as, or step1..step2)",
        "retriable": False,
    }


async def test_a_single_template_naming_a_missing_variable_is_refused_before_anything_runs(pipeline, standins):
    # upstream: interpolate 'returns undefined when a single-template references a missing path'
    answer, v = await run(pipeline, standins, INTERPOLATE_VARS, "{{absent.var}}")
    assert v is None and standins.calls == []
    assert failed(answer)["code"] == "INTERPOLATION_FAILED"


async def test_recurses_into_objects(pipeline, standins):
    # upstream: interpolate 'recurses into objects'
    _, v = await run(pipeline, standins, INTERPOLATE_VARS, {"a": "{{step1.id}}", "b": "plain"})
    assert v == {"a": "msg_123", "b": "plain"}


async def test_recurses_into_arrays(pipeline, standins):
    # upstream: interpolate 'recurses into arrays'
    _, v = await run(pipeline, standins, INTERPOLATE_VARS, ["{{step1.id}}", "plain", "{{step2.url}}"])
    assert v == ["msg_123", "plain", "https://example.com"]


async def test_does_not_interpolate_non_string_primitives(pipeline, standins):
    # upstream: interpolate 'does not interpolate non-string primitives'
    _, v = await run(pipeline, standins, INTERPOLATE_VARS, {"n": 42, "b": True, "nul": None})
    assert v == {"n": 42, "b": True, "nul": None}


# --- evalCondition ----------------------------------------------------------------------------------------


async def test_returns_true_for_a_truthy_path(pipeline, standins):
    # upstream: evalCondition 'returns true for a truthy path'
    for condition in ("{{step1.has_items}}", "{{step2.count}}"):
        standins.calls.clear()
        answer, _ = await run(pipeline, standins, CONDITION_VARS, **{"if": condition})
        assert answer["steps"][-1]["status"] == "success", condition
        assert "fake_tool_1" in [name for name, _ in standins.calls]


async def test_returns_false_for_a_falsy_path(pipeline, standins):
    # upstream: evalCondition 'returns false for a falsy path'. Its `{{absent.path}}` is a variable that is not
    # there: the step that would have set it failed (discord saves only successes), so the step is skipped.
    for condition in ("{{step1.count}}", "{{step1.name}}"):
        standins.calls.clear()
        answer, _ = await run(pipeline, standins, CONDITION_VARS, **{"if": condition})
        assert answer["steps"][-1]["status"] == "skipped", condition
        assert "fake_tool_1" not in [name for name, _ in standins.calls]
    standins.calls.clear()
    standins.respond("messages_read", err("DISCORD_NOT_FOUND", "gone"))
    steps = [
        {"id": "absent", "tool": "messages_read", "args": {}, "continue_on_error": True},
        {"id": "probe", "tool": "fake_tool_1", "args": {}, "if": "{{absent.path}}"},
    ]
    answer = (await pipeline({"steps": steps})).structured_content
    assert [s["status"] for s in answer["steps"]] == ["error", "skipped"]
    assert answer["aborted"] is False


async def test_strips_outer_braces_if_present(pipeline, standins):
    # upstream: evalCondition 'strips outer {{ }} if present'
    answer, _ = await run(pipeline, standins, CONDITION_VARS, **{"if": "step1.has_items"})
    assert answer["steps"][-1]["status"] == "success"
