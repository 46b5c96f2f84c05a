"""Run a compiled CEL program and turn its value into JSON data; also the CEL worker process.

This module imports nothing of mcpipe, so a worker (``python .../_celexec.py``, see
:mod:`mcpipe.expr._celworker`) starts in the time it takes to import the CEL library.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
import sys
from collections.abc import Mapping
from typing import Any

import cel
import cel.stdlib
import orjson

__all__ = ["CelError", "execute_cel", "to_json_value"]


class CelError(Exception):
    """A CEL evaluation that failed (:class:`mcpipe.errors.ExpressionError` once it reaches mcpipe; this
    module cannot import mcpipe, see above).

    Attributes:
        missing: True when it failed because a value was absent (an unknown key, an undefined variable).
    """

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


# The cel-go style extension functions (strings, math, lists, sets, encoders): opt-in in the library, on
# for us. An expression gets only the ones it calls, since registering functions costs per evaluation.
_EXTENSIONS: dict[str, Any] = {name: fn for lib in cel.stdlib.EXTENSIONS.values() for name, fn in lib.items()}

_UNDEFINED = re.compile(r"Undefined variable or function: '([^']*)'")


def execute_cel(program: Any, context: dict[str, Any], functions: Mapping[str, Any] | list[str]) -> Any:
    """Run a compiled CEL program; its JSON-ready value.

    Args:
        functions: the extension functions it calls, by name or as a ready mapping.

    Raises:
        CelError: the expression failed.
    """
    if isinstance(functions, list):
        functions = {name: _EXTENSIONS[name] for name in functions if name in _EXTENSIONS}
    try:
        if functions:
            result = program.execute(cel.Context(context, functions=dict(functions)))
        else:
            result = program.execute(context)
    except KeyError as e:
        raise CelError(f"no such key: {e.args[0]!r}", missing=True) from None
    except RuntimeError as e:
        text = str(e)
        unknown = _UNDEFINED.match(text)
        if unknown is not None:
            # Every variable is a root, checked at load and always passed: this is a function.
            raise CelError(f"unknown function '{unknown.group(1)}'") from None
        raise CelError(text) from None
    except Exception as e:  # the CEL library raises TypeError, ValueError, ZeroDivisionError, ...
        raise CelError(f"{type(e).__name__}: {e}") from None
    return to_json_value(result)


def to_json_value(value: object) -> Any:
    """Turn what CEL or JSONata returns into plain JSON-ready data (dict, list, str, int, float, ...)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise CelError(f"the result is not JSON data: {type(value).__name__}")


def _serve() -> None:
    """The worker: answer request lines (``{"source", "context", "functions"}``) until stdin closes."""
    out = sys.stdout.buffer
    out.write(b"ready\n")
    out.flush()
    programs: dict[str, Any] = {}
    for line in sys.stdin.buffer:
        request = orjson.loads(line)
        source = request["source"]
        program = programs.get(source)
        if program is None:
            if len(programs) > 256:
                programs.clear()
            program = programs[source] = cel.compile(source)
        try:
            reply: dict[str, Any] = {"value": execute_cel(program, request["context"], request["functions"])}
        except CelError as e:
            reply = {"error": str(e), "missing": e.missing}
        try:
            data = orjson.dumps(reply)
        except TypeError:  # integers past 64 bits
            import json

            data = json.dumps(reply).encode()
        out.write(data + b"\n")
        out.flush()


if __name__ == "__main__":
    _serve()
