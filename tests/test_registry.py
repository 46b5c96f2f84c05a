"""The tool registry: functions as tools, schemas from type hints, validated arguments."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from mcpipe.tools import FunctionTool, ToolContext, ToolRegistry, ToolResult, UnknownToolError


class Page(msgspec.Struct):
    url: str
    content: str


def make_registry() -> ToolRegistry:
    reg = ToolRegistry()

    @reg.tool
    async def search(query: str, limit: int = 3) -> dict[str, Any]:
        """Search the web.

        Args:
            query: what to look for.
            limit: how many results to return,
                at most.
        """
        return {"results": [f"{query}-{i}" for i in range(limit)]}

    @reg.tool(name="fetch_page", description="Fetch one page.")
    def fetch(url: str) -> Page:
        return Page(url, f"content of {url}")

    @reg.tool
    def greet(name: str) -> str:
        return f"hello {name}"

    @reg.tool
    def count(items: list[int]) -> int:
        return len(items)

    @reg.tool
    async def whoami(ctx: ToolContext, prefix: str = "") -> str:
        return f"{prefix}{ctx.request_id}/{ctx.step}"

    @reg.tool
    def explode() -> str:
        raise RuntimeError("boom")

    return reg


def test_registry_lists_tools_by_name_in_registration_order():
    reg = make_registry()
    assert reg.names() == ["search", "fetch_page", "greet", "count", "whoami", "explode"]
    assert len(reg) == 6
    assert "search" in reg and "nope" not in reg
    assert [t.name for t in reg] == reg.names()
    assert isinstance(reg.get("greet"), FunctionTool)
    assert reg.get("nope") is None


def test_input_schema_comes_from_type_hints_with_defaults_optional_and_docstring_descriptions():
    tool = make_registry().get("search")
    assert tool.description == "Search the web."
    assert tool.input_schema == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for."},
            "limit": {"type": "integer", "default": 3, "description": "how many results to return, at most."},
        },
        "required": ["query"],
        "additionalProperties": False,
    }


def test_context_parameter_is_left_out_of_the_schema():
    tool = make_registry().get("whoami")
    assert tool.input_schema["properties"] == {"prefix": {"type": "string", "default": ""}}
    assert tool.input_schema["required"] == []


def test_output_schema_is_the_return_type_and_non_objects_are_wrapped_in_result():
    reg = make_registry()
    assert reg.get("fetch_page").output_schema == {
        "type": "object",
        "properties": {"url": {"type": "string"}, "content": {"type": "string"}},
        "required": ["url", "content"],
    }
    assert reg.get("count").output_schema == {
        "type": "object",
        "properties": {"result": {"type": "integer"}},
        "required": ["result"],
    }
    assert reg.get("greet").output_schema is None


async def test_structured_return_gives_structured_content_and_the_same_json_as_text():
    res = await make_registry().call("fetch_page", {"url": "https://a"}, ToolContext())
    assert res.structured == {"url": "https://a", "content": "content of https://a"}
    assert res.content == [{"type": "text", "text": '{"url":"https://a","content":"content of https://a"}'}]
    assert not res.is_error


async def test_non_object_return_is_wrapped_in_result():
    res = await make_registry().call("count", {"items": [1, 2, 3]}, ToolContext())
    assert res.structured == {"result": 3}


async def test_str_return_is_one_text_block():
    res = await make_registry().call("greet", {"name": "ada"}, ToolContext())
    assert res == ToolResult([{"type": "text", "text": "hello ada"}], None, False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"query": 5}, "invalid arguments for tool 'search': Expected `str`, got `int` - at `args.query`"),
        ({}, "invalid arguments for tool 'search': Object missing required field `query` - at `args`"),
        (
            {"query": "x", "lmit": 2},
            "invalid arguments for tool 'search': Object contains unknown field `lmit` - at `args`",
        ),
        (
            {"query": "x", "limit": "2"},
            "invalid arguments for tool 'search': Expected `int`, got `str` - at `args.limit`",
        ),
    ],
)
async def test_bad_arguments_answer_a_located_tool_error_without_calling(args, message):
    res = await make_registry().call("search", args, ToolContext())
    assert res.is_error
    assert res.joined_text() == message


async def test_context_parameter_receives_the_call_context():
    ctx = ToolContext(request_id="r-7").for_step("p", "s1")
    res = await make_registry().call("whoami", {"prefix": ">"}, ctx)
    assert res.joined_text() == ">r-7/s1"


async def test_a_raising_tool_propagates_its_exception():
    with pytest.raises(RuntimeError, match="boom"):
        await make_registry().call("explode", {}, ToolContext())


async def test_calling_an_unknown_tool_raises_a_clear_error():
    with pytest.raises(UnknownToolError, match="unknown tool 'nope'"):
        await make_registry().call("nope", {}, ToolContext())


def test_registering_a_name_twice_is_an_error():
    reg = make_registry()
    with pytest.raises(ValueError, match="already registered"):
        reg.tool(name="greet")(lambda: "x")


def test_allows_every_tool_by_default():
    assert make_registry().allows("greet", ToolContext())


def test_register_accepts_any_object_shaped_like_a_tool():
    class Echo:
        name = "echo"
        description = "echo"
        input_schema: dict[str, Any] = {"type": "object"}
        output_schema = None

        async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            return ToolResult(structured=args)

    reg = ToolRegistry([Echo()])
    assert reg.names() == ["echo"]


@pytest.mark.parametrize("bad", ["", "has space", "x" * 129])
def test_invalid_tool_names_are_refused(bad):
    with pytest.raises(ValueError, match="invalid tool name"):
        ToolRegistry().tool(name=bad)(lambda: "x")


def test_star_parameters_are_refused():
    def f(*items: int) -> int:
        return 0

    with pytest.raises(TypeError, match=r"\*args"):
        ToolRegistry().tool(f)
