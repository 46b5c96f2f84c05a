"""A large result from a stdio downstream is read in time linear in its size (issue 9, point 7)."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest
import trio

from kit.hostile import make_config
from mcpipe.downstream import LineChunks
from mcpipe.server import open_app
from mcpipe.tools import ToolContext

BIG = str(Path(__file__).with_name("big_downstream.py"))


class Chunks:
    """A byte stream handing out the given chunks, then its end (what a pipe delivers, chunk by chunk)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await trio.lowlevel.checkpoint()
        if not self.chunks:
            raise anyio.EndOfStream
        return self.chunks.pop(0)

    async def aclose(self) -> None:
        pass


async def texts(chunks: list[bytes]) -> list[str]:
    return [text async for text in LineChunks(Chunks(chunks))]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([b"ab", b"cd\nef", b"g\n"], ["abcd\n", "efg\n"]),
        ([b"a\nb\nc", b"\n"], ["a\nb\n", "c\n"]),
        ([b"x" * 10, b"y" * 10], ["x" * 10 + "y" * 10]),  # the end of the stream ends the last line
        ([b"\xc3", b"\xa9\n"], ["\u00e9\n"]),  # a character split between chunks
    ],
)
async def test_line_chunks_end_every_chunk_at_a_line_end(chunks, expected):
    assert await texts(chunks) == expected


async def test_a_line_past_the_bound_breaks_the_stream(monkeypatch):
    monkeypatch.setattr("mcpipe.downstream._lines.MAX_LINE_CHARS", 15)
    with pytest.raises(anyio.BrokenResourceError):
        await texts([b"x" * 10, b"x" * 10, b"\n"])


def test_the_sdk_stdio_client_reads_through_line_chunks():
    import mcp.client.stdio

    import mcpipe.downstream  # noqa: F401  (installs it)

    assert mcp.client.stdio.TextReceiveStream is LineChunks


async def test_a_6_mb_result_from_a_stdio_downstream_arrives_whole():
    config = make_config(mcpServers={"big": {"command": sys.executable, "args": [BIG]}})
    async with open_app(config) as app:
        with trio.fail_after(60):
            result = await app.gateway.call("big.big", {"n": 6_000_000}, ToolContext())
    assert result.content[0]["text"] == "x" * 6_000_000
