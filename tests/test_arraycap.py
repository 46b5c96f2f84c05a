"""The Rust core's ``ArrayCap`` (a ``tools/list`` answer cut as it streams) against an obviously correct
oracle: parse the JSON, cut ``result.tools``, compare; whatever the chunks the bytes come in."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mcpipe._core import ArrayCap

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def _oracle(message: Any, max_items: int) -> tuple[Any, int]:
    result = message.get("result") if isinstance(message, dict) else None
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list):
        return message, 0
    return {**message, "result": {**result, "tools": tools[:max_items]}}, len(tools)


@settings(max_examples=300, deadline=None)
@given(
    tools=st.lists(values, max_size=12),
    extra=st.dictionaries(st.sampled_from(["nextCursor", "_meta", "tool", "tools2"]), values, max_size=3),
    max_items=st.integers(min_value=0, max_value=6),
    chunk=st.integers(min_value=1, max_value=40),
    indent=st.sampled_from([None, 1]),
)
def test_the_cut_is_the_json_with_its_tools_array_cut(tools, extra, max_items, chunk, indent):
    message = {"jsonrpc": "2.0", "id": 1, "result": {**extra, "tools": tools}}
    text = json.dumps(message, indent=indent, ensure_ascii=False).encode()
    cap = ArrayCap(max_items)
    out = b"".join(cap.feed(text[i : i + chunk]) for i in range(0, len(text), chunk))
    expected, total = _oracle(message, max_items)
    assert json.loads(out) == expected
    assert cap.total == total


@given(message=values, max_items=st.integers(min_value=0, max_value=3))
def test_a_message_without_a_tools_listing_passes_unchanged(message, max_items):
    text = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"content": message}}).encode()
    assert ArrayCap(max_items).feed(text) == text


async def test_a_stdio_line_listing_tools_is_cut_before_the_sdk_reads_it():
    import anyio

    from mcpipe.downstream._lines import LISTING_CAP, LineChunks, ListingCap

    listing = ListingCap(2)
    message = {"jsonrpc": "2.0", "id": 3, "result": {"tools": [{"name": f"t{i}", "d": "a\u2028b"} for i in range(5)]}}
    other = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": '"tools" said \u2028 here'}}
    text = json.dumps(other, ensure_ascii=False) + "\n" + json.dumps(message, ensure_ascii=False) + "\n"
    send, receive = anyio.create_memory_object_stream[bytes](10)
    token = LISTING_CAP.set(listing)
    try:
        lines = LineChunks(receive)
    finally:
        LISTING_CAP.reset(token)
    async with send, receive:
        await send.send(text.encode())
        await send.aclose()
        got = "".join([chunk async for chunk in lines])
    first, second, rest = got.split("\n")
    assert json.loads(first) == other and rest == ""
    assert [t["name"] for t in json.loads(second)["result"]["tools"]] == ["t0", "t1"] and listing.seen == 5
