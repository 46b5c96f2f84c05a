"""The worker process of :mod:`mcpipe._pattern`: matches the patterns the linear-time engine does not take
(lookaround, backreferences) with Python's ``re``, one request line at a time, until stdin closes.

It imports nothing of mcpipe, so it starts in the time Python takes to start. Request: ``[pattern, text]``
as JSON; reply: ``1`` (found), ``0`` (not found) or ``E`` and the compile error, one line each (the framing of
:mod:`mcpipe._workerpool`). Its address space is bounded by the pool (a pattern that builds a huge state
fails, it does not take the machine's memory); a match that runs long is ended by the pool killing the
process.
"""

from __future__ import annotations

import json
import re
import sys


def _serve() -> None:
    out = sys.stdout.buffer
    out.write(b"ready\n")
    out.flush()
    compiled: dict[str, re.Pattern[str]] = {}
    for line in sys.stdin.buffer:
        pattern, text = json.loads(line)
        try:
            rx = compiled.get(pattern)
            if rx is None:
                if len(compiled) > 256:
                    compiled.clear()
                rx = compiled[pattern] = re.compile(pattern)
            reply = b"1\n" if rx.search(text) is not None else b"0\n"
        except (re.error, RecursionError, MemoryError) as e:
            reply = b"E" + str(e).replace("\n", " ").encode() + b"\n"
        out.write(reply)
        out.flush()


if __name__ == "__main__":
    _serve()
