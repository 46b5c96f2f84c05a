"""The plan cache charges what a plan really holds (issue 20, point 5): the charge bounds the resident memory
of a compiled plan from above on every shape of spec, and distinct large specs over HTTP no longer pile up
past ``pipe.compile_cache_bytes``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from kit.attack import served, write_config
from kit.hostile import call
from mcpipe.gateway import PIPE_TOOL

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

PYTHON = Path(__file__).parent.parent.parent / "python"

SHAPES = {
    "references": lambda i, n: {"a": ["${vars.x}"] * n},
    "interpolations": lambda i, n: {"a": ["a${vars.x}b${vars.x}"] * n},
    "deep paths": lambda i, n: {"a": ["${vars.x.a.b.c.d.e.f.g.h.i.j}"] * n},
    "keys": lambda i, n: {f"k{j}": "${vars.x}" for j in range(n)},
    "small objects": lambda i, n: {"a": [{"k": "v"}] * n},
    "empty objects": lambda i, n: {"a": [{}] * n},
    "strings": lambda i, n: {"a": ["abcdefgh"] * n},
}

MEASURE = """
import gc, json, os, sys
import orjson
from mcpipe.compile import _CACHE, compile_spec, configure_cache
from mcpipe.plan import Limits

def rss():
    with open(f"/proc/{os.getpid()}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

configure_cache(max_bytes=1 << 40)
limits = Limits(max_spec_bytes=16 << 20)
seen = {}
for shape, specs in json.loads(sys.stdin.read()).items():
    texts = [orjson.dumps(spec) for spec in specs]
    gc.collect()
    before, charged = rss(), _CACHE.bytes
    for text in texts:
        compile_spec(text, limits=limits)  # kept by the cache only
    gc.collect()
    n = len(texts)
    seen[shape] = {"grown": (rss() - before) / n, "charged": (_CACHE.bytes - charged) / n, "text": len(texts[0])}
print(json.dumps(seen))
"""


def test_the_charge_of_a_cached_plan_bounds_its_resident_memory_on_every_shape():
    # Before: each plan was charged twice its text; it held 7 to 60 times its text.
    specs = {
        shape: [{"vars": {"x": i}, "steps": [{"tool": "echo", "args": make(i, 40_000)}]} for i in range(2)]
        for shape, make in SHAPES.items()
    }
    out = subprocess.run(
        [sys.executable, "-c", MEASURE],
        input=json.dumps(specs),
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(PYTHON)},
        timeout=120,
        check=True,
    )
    for shape, seen in json.loads(out.stdout).items():
        assert seen["grown"] > 2 * seen["text"], (shape, seen)  # what the cache charged before: far too little
        assert seen["charged"] >= seen["grown"], (shape, seen)


def referencing_spec(i: int, n: int = 40_000) -> dict:
    """About 0.5 MB of references (about 24 MB compiled), whose one step is skipped: only compiling costs."""
    return {
        "vars": {"x": i, "off": False},
        "steps": [{"tool": "echo", "when": "${vars.off}", "args": {"a": ["${vars.x}"] * n}}],
    }


async def test_distinct_large_specs_over_http_stay_within_the_cache_bound(tmp_path):
    # Before: 14 distinct 3.6 MB specs plateaued at 1.97 GB under a 64 MiB cache; here an 8 MiB cache kept
    # every plan (about 24 MB each, charged 1 MB each): RSS grew 120 MB over 5 specs.
    config = write_config(tmp_path, "pipe:\n  compile_cache_bytes: 8388608\n")
    async with served(config) as server:
        await server.call(PIPE_TOOL, referencing_spec(-1, 10))
        before = server.rss_mb()
        slowest = 0.0
        for i in range(5):
            body = orjson.dumps(call(PIPE_TOOL, referencing_spec(i)))
            answer, took = await server.probed(lambda body=body: server.post(body, PIPE_TOOL))
            assert answer["result"]["structuredContent"]["summary"]["skipped"] == 1
            slowest = max(slowest, took)
        grown = server.rss_mb() - before
    print(f"RSS grew {grown:.0f} MB")
    assert grown < 70, grown  # about one plan being compiled at a time
    assert slowest < server.stall_s, server.health
