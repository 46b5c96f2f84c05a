"""One side of ``benches/test_workers.py``'s A/B: run in the interpreter of the tree to measure (this one, or
a baseline's), it times calls into the killable worker processes and prints one JSON line:
``{"cel_ms": [...], "pattern_ms": [...]}``.

    python benches/worker_probe.py ROUNDS

Each CEL round is one evaluation of an expression that iterates (so it runs in a worker:
``mcpipe.expr._celworker``), each pattern round one search with a lookahead (which only the fallback engine
takes: ``mcpipe._pattern``), both against a warm worker (one call of each first starts it).
"""

from __future__ import annotations

import json
import sys
import time

import trio

from mcpipe._pattern import compile_pattern
from mcpipe.expr._celworker import evaluate_in_worker

CEL = "args.items.map(x, x * 2).size()"
CONTEXT = {"args": {"items": list(range(50))}}
PATTERN = r"^(?=.*\d)(?=.*[a-z]).{8,}$"
TEXT = "abcdefgh1234"


async def cel_ms(rounds: int) -> list[float]:
    assert await evaluate_in_worker(CEL, CONTEXT, [], 30.0) == {"value": 50}
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await evaluate_in_worker(CEL, CONTEXT, [], 30.0)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def pattern_ms(rounds: int) -> list[float]:
    pattern = compile_pattern(PATTERN)
    assert not pattern.linear and pattern.search(TEXT)
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        pattern.search(TEXT)
        out.append((time.perf_counter() - t0) * 1000)
    return out


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    print(json.dumps({"cel_ms": trio.run(cel_ms, rounds), "pattern_ms": pattern_ms(rounds)}))
