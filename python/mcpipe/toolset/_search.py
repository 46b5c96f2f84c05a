"""Tool search: ``search_tools`` ranks every tool a caller may call against a query (BM25, by ``bm25s``, over
the tool's name, title, description and argument names, stemmed by Snowball), and ``describe_tools`` answers
the full ``tools/list`` entries of the ones chosen.

The index is built from the tools the gateway serves and rebuilt when that set changes (a downstream server
listing again after ``list_changed``, a registry's servers coming and going): each search compares the tools'
identities with the index's, which costs a pass over the names, not a rebuild. Rights apply inside the ranking:
a tool the caller may not call weighs nothing, so it is never found, and ``describe_tools`` says of it what
it says of a tool that does not exist.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from mcpipe._util import PIPE_TOOL
from mcpipe.errors import ErrorCode
from mcpipe.tools import PURE, Tool, ToolContext, ToolResult

__all__ = ["DESCRIBE_TOOL", "SEARCH_TOOL", "SearchIndex", "search_tools"]

SEARCH_TOOL = "search_tools"
DESCRIBE_TOOL = "describe_tools"
MAX_QUERY = 1000
"""The longest query read (characters)."""
MAX_DESCRIBED = 50
"""The most tools one ``describe_tools`` call describes."""

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORDS = re.compile(r"[^0-9A-Za-z]+")
Wire = Callable[[Tool], dict[str, Any]]


def _arguments(tool: Tool) -> list[str]:
    """The names of a tool's arguments (its input schema's properties)."""
    props = tool.input_schema.get("properties") if isinstance(tool.input_schema, dict) else None
    return [str(a) for a in props] if isinstance(props, dict) else []


def _text_of(tool: Tool) -> str:
    """What a tool is found by: its name (split at ``_ . - /`` and camelCase), title, description, arguments."""
    props = _arguments(tool)
    name = _CAMEL.sub(" ", _WORDS.sub(" ", tool.name))
    args = " ".join(_CAMEL.sub(" ", _WORDS.sub(" ", str(a))) for a in props)
    title = getattr(tool, "title", None) or ""
    # The name and title weigh twice: they say what the tool does in a few words.
    return f"{name} {name} {title} {title} {tool.description or ''} {args}"


class SearchIndex:
    """A BM25 index over a set of tools, rebuilt when the set changes."""

    def __init__(self) -> None:
        self._key: tuple[int, ...] | None = None
        self._tools: list[Tool] = []
        self._names: list[str] = []
        self._retriever: Any = None
        self._masks: dict[str | None, Any] = {}

    def refresh(self, tools: Iterable[Tool]) -> None:
        """Rebuild the index unless ``tools`` are the ones it holds (by identity)."""
        listed = [t for t in tools if t.name not in (SEARCH_TOOL, DESCRIBE_TOOL, PIPE_TOOL)]
        key = tuple(id(t) for t in listed)
        if key == self._key:
            return
        import bm25s

        self._tools = listed  # held, so an id in the key is never a later object's
        self._names = [t.name for t in listed]
        self._masks = {}
        self._key = key
        if not listed:
            self._retriever = None
            return
        corpus = bm25s.tokenize([_text_of(t) for t in listed], stopwords="en", stemmer=_stemmer(), show_progress=False)
        retriever = bm25s.BM25()
        retriever.index(corpus, show_progress=False)
        self._retriever = retriever

    def search(self, query: str, limit: int, allowed: Callable[[str], bool], principal: Any = None) -> list[Tool]:
        """The ``limit`` best tools for ``query`` among those ``allowed`` (a tool it refuses weighs nothing).

        ``principal``: a key under which the mask of allowed tools is kept until the index changes (None: it is
        computed for this search only, as when the rights depend on more than the principal)."""
        if self._retriever is None:
            return []
        import bm25s
        import numpy as np

        tokens = bm25s.tokenize(
            [query[:MAX_QUERY]], stopwords="en", stemmer=_stemmer(), return_ids=False, show_progress=False
        )
        words = tokens[0] if tokens else []
        if not words:
            return []
        mask = self._masks.get(principal) if principal is not None else None
        if mask is None:
            mask = np.fromiter(
                (1.0 if allowed(n) else 0.0 for n in self._names), dtype=np.float32, count=len(self._names)
            )
            if principal is not None:
                self._masks[principal] = mask
        scores = self._retriever.get_scores(list(words), weight_mask=mask)
        k = min(limit, len(scores))
        top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        ranked = sorted(top, key=lambda i: (-scores[i], self._names[i]))
        return [self._tools[i] for i in ranked if scores[i] > 0]


_STEMMER: Any = None


def _stemmer() -> Any:
    global _STEMMER
    if _STEMMER is None:
        import snowballstemmer

        _STEMMER = snowballstemmer.stemmer("english")
    return _STEMMER


SEARCH_DESCRIPTION = (
    "Find the tools for a task. This server lists only a few tools; the others are found here. Give a query in "
    "plain words (what you want to do, the objects involved); the answer lists the best matching tools you may "
    "call, each with its name, a one-line description and its argument names. Call a found tool directly by its "
    "name, or chain several in one `mcp_pipe` call; `describe_tools` gives their full input schemas."
)
DESCRIBE_DESCRIPTION = (
    "The full definitions (description, input schema, annotations) of tools named by `search_tools`, as "
    "`tools/list` would list them. Then call them directly or as `mcp_pipe` steps."
)


def _summary(tool: Tool) -> dict[str, Any]:
    text = (tool.description or "").strip().split("\n", 1)[0]
    entry: dict[str, Any] = {"name": tool.name, "description": text[:200]}
    title = getattr(tool, "title", None)
    if title:
        entry["title"] = title
    entry["arguments"] = _arguments(tool)
    required = tool.input_schema.get("required") if isinstance(tool.input_schema, dict) else None
    if isinstance(required, list) and required:
        entry["required"] = required
    return entry


class _SearchTool:
    name = SEARCH_TOOL
    title = "Search the tools"
    description = SEARCH_DESCRIPTION
    output_schema: dict[str, Any] | None = None
    annotations = PURE

    def __init__(self, index: SearchIndex, limit: int) -> None:
        self.index = index
        self.limit = limit
        self.input_schema = {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What you want to do, in a few words."},
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": limit,
                    "description": f"At most this many tools (default {limit}).",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        }

    async def call(self, args: Mapping[str, object], ctx: ToolContext) -> ToolResult:
        query, limit = args.get("query"), args.get("limit", self.limit)
        if not isinstance(query, str) or not query.strip():
            return ToolResult.error(f"{ErrorCode.INVALID_SPEC}: args.query: a non-empty string")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= self.limit:
            return ToolResult.error(f"{ErrorCode.INVALID_SPEC}: args.limit: an integer from 1 to {self.limit}")
        gateway = ctx.tools
        if gateway is None:
            return ToolResult.error(f"{ErrorCode.TOOL_FAILED}: search_tools needs the server's gateway")
        ready = getattr(gateway, "ready", None)
        if ready is not None:
            await ready()
        allows = getattr(gateway, "allows", None)
        self.index.refresh(cast(Iterable[Tool], gateway))  # the gateway: its tools, as the caller's registry
        trust = getattr(gateway, "trust", None)

        def allowed(name: str) -> bool:
            return allows is None or bool(allows(name, ctx))

        # Rights by principal alone can be kept per principal; trust rules read more of the caller.
        key = ("principal", ctx.principal) if trust is None else None
        found = self.index.search(query, limit, allowed, key)
        out = {
            "tools": [_summary(t) for t in found],
            "next": "Call a tool by its name, or chain them in mcp_pipe; describe_tools gives their input schemas.",
        }
        import orjson

        return ToolResult([{"type": "text", "text": orjson.dumps(out).decode()}], out)


class _DescribeTool:
    name = DESCRIBE_TOOL
    title = "Describe tools"
    description = DESCRIBE_DESCRIPTION
    output_schema: dict[str, Any] | None = None
    annotations = PURE
    input_schema = {
        "type": "object",
        "properties": {
            "names": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_DESCRIBED},
        },
        "required": ["names"],
        "additionalProperties": False,
    }

    def __init__(self, wire: Wire) -> None:
        self.wire = wire

    async def call(self, args: Mapping[str, object], ctx: ToolContext) -> ToolResult:
        names = args.get("names")
        if (
            not isinstance(names, list)
            or not names
            or len(names) > MAX_DESCRIBED
            or not all(isinstance(n, str) for n in names)
        ):
            return ToolResult.error(f"{ErrorCode.INVALID_SPEC}: args.names: 1 to {MAX_DESCRIBED} tool names")
        gateway = ctx.tools
        get = getattr(gateway, "get", None)
        allows = getattr(gateway, "allows", None)
        tools, unknown = [], []
        for name in dict.fromkeys(names):
            tool = get(name) if get is not None and name not in (SEARCH_TOOL, DESCRIBE_TOOL) else None
            if tool is None or (allows is not None and not allows(name, ctx)):
                unknown.append(name)  # a tool the caller may not call is one it cannot find
            else:
                tools.append(self.wire(tool))
        out: dict[str, Any] = {"tools": tools}
        if unknown:
            out["unknown"] = unknown
        import orjson

        return ToolResult([{"type": "text", "text": orjson.dumps(out).decode()}], out)


class _SearchSource:
    """``search_tools`` and ``describe_tools``, as a tool source."""

    def __init__(self, limit: int, wire: Wire) -> None:
        self.index = SearchIndex()
        self._tools: dict[str, Any] = {SEARCH_TOOL: _SearchTool(self.index, limit), DESCRIBE_TOOL: _DescribeTool(wire)}

    def get(self, name: str) -> Any:
        return self._tools.get(name)

    def __iter__(self) -> Any:
        return iter(self._tools.values())


def search_tools(limit: int, wire: Wire) -> _SearchSource:
    """The search tools' source: ``limit`` tools at most per search, each described by ``wire``."""
    return _SearchSource(limit, wire)
