"""The ``python`` role of the sandbox's workers: runs one step's code with NoETL's semantics.

The sandbox's fork server (:mod:`mcpipe._sandbox._zygote`) loads this file by path (it imports nothing of
mcpipe) and forks a fresh worker per step, which sets its limits, drops its uid and calls :func:`handle`
with the step's request: the code, and its input and context as data. The reply is one JSON object,
``{"ok": true, "result": ...}`` or ``{"ok": false, "error", "type", "line", "traceback"}``. The code's
stdout and stderr are the process's own, read (bounded) by the server. The caller's values reach the code
only as data decoded from the request, never as code.

NoETL's semantics (``noetl/tools/python/executor.py``, 4.26.0): the ``input`` values are globals of the
code (JSON or Python literals in strings decoded when ``coerce`` is set), beside ``context`` (the step's
render context), ``data`` (``context['data']``, else ``context['result']``) and the modules ``os``,
``json``, ``datetime`` and ``uuid``. Code that defines ``main`` has it called with the arguments its
signature names, looked up in ``input``, then ``context['input']``, ``context['data']`` and ``context``
(``context`` itself for a parameter of that name; ``**kwargs`` gets the rest); its return value is the
result (a coroutine is run to completion). Otherwise the result is the variable ``result`` the code sets,
or, when it sets none, NoETL's ``{"status": "success", "message": ..., "locals_count", "locals_keys"}``.
"""

from __future__ import annotations
import __future__

import binascii
import builtins
import datetime
import json
import marshal
import os
import struct
import sys
import types
import uuid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# The fork server loads this file, so what it imports is in every worker's image (``_zygote.IMAGE``): the
# modules a step's globals hold (``os``, ``json``, ``datetime``, ``uuid``) and what every step's path uses.
# What only some steps need is imported at its first use, in the worker: ``inspect`` (a ``main`` that is not
# a plain function), ``ast`` (a coerced input that is not JSON), ``traceback`` (a step that raised).

ASYNC_IMPORTS = ("asyncio",)
"""What the worker of a step that may run a coroutine (:func:`needs_asyncio`) imports while it waits for its
request. The fork server does not import it: ``asyncio`` (and ``threading``, with its after-fork hook, which
it imports) would make every worker's fork, start and exit dearer, for the few steps that need it."""

_CO_VARARGS = 0x04
_CO_VARKEYWORDS = 0x08
_ASYNC_FLAGS = 0x080 | 0x100 | 0x200
"""``inspect.CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR`` (``inspect``'s values, the same
since Python 3.6: a test compares them)."""

FILENAME = "<python step>"
_FLAGS = __future__.annotations.compiler_flag  # as the worker has always compiled a step's code


def compile_step(code: str) -> types.CodeType:
    """A step's code compiled as the worker runs it (raises SyntaxError, ValueError...)."""
    return compile(code, FILENAME, "exec", flags=_FLAGS, dont_inherit=True)


def needs_asyncio(program: types.CodeType) -> bool:
    """Whether a step's compiled code may run a coroutine: it defines an ``async`` function (at any depth) or
    imports ``asyncio``. A step this misses (a coroutine made some other way) still runs: its worker imports
    ``asyncio`` when its ``main`` returns a coroutine, only later."""
    stack = [program]
    while stack:
        code = stack.pop()
        if code.co_flags & _ASYNC_FLAGS or "asyncio" in code.co_names:
            return True
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return False


def program_text(program: types.CodeType) -> str:
    """A step's compiled code as text for the request's header (``marshal``, base64: the fork server runs
    the server's own interpreter, so the worker reads it back as it is, without compiling it again)."""
    return binascii.b2a_base64(marshal.dumps(program), newline=False).decode("ascii")


class _Failure(Exception):
    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


def _coerce(value: object) -> Any:
    """NoETL's ``_coerce_param``: a string holding a JSON or Python object or array literal, decoded."""
    if isinstance(value, str):
        s = value.strip()
        if (s.startswith("{") and s.endswith("}")) or (s.startswith("[") and s.endswith("]")):
            try:
                return json.loads(s)
            except ValueError:
                import ast  # (at first use: most inputs are JSON)

                try:
                    return ast.literal_eval(s)
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    return value
    return value


_POSITIONAL_ONLY, _NAMED, _VAR_POSITIONAL, _KEYWORD_ONLY, _VAR_KEYWORD = range(5)
"""A parameter's kind, as the values of ``inspect.Parameter``'s kinds (an ``IntEnum``: a test compares)."""


def _parameters(fn: Any) -> list[tuple[str, int, bool]]:
    """``fn``'s parameters as ``(name, kind, has_default)``: read from a plain function's code object
    directly (what ``inspect.signature`` would say, at a fraction of its cost, and without importing
    ``inspect``), else from the signature."""
    if type(fn) is types.FunctionType and not hasattr(fn, "__wrapped__") and not hasattr(fn, "__signature__"):
        code = fn.__code__
        names = code.co_varnames
        positional = code.co_argcount
        kwonly = code.co_kwonlyargcount
        defaults = len(fn.__defaults__ or ())
        kwdefaults = fn.__kwdefaults__ or {}
        out: list[tuple[str, int, bool]] = []
        for i in range(positional):
            kind = _POSITIONAL_ONLY if i < code.co_posonlyargcount else _NAMED
            out.append((names[i], kind, i >= positional - defaults))
        at = positional + kwonly
        if code.co_flags & _CO_VARARGS:
            out.append((names[at], _VAR_POSITIONAL, False))
            at += 1
        for name in names[positional : positional + kwonly]:
            out.append((name, _KEYWORD_ONLY, name in kwdefaults))
        if code.co_flags & _CO_VARKEYWORDS:
            out.append((names[at], _VAR_KEYWORD, False))
        return out
    import inspect  # (at first use: a decorated or callable-object ``main``)

    empty = inspect.Parameter.empty
    return [(p.name, int(p.kind), p.default is not empty) for p in inspect.signature(fn).parameters.values()]


def _kwargs(fn: object, provided: Mapping[str, object], context: object) -> dict[str, Any]:
    """NoETL's ``_build_call_kwargs``: ``main``'s arguments by name."""
    ctx: dict[str, Any] = context if isinstance(context, dict) else {}
    found = ctx.get("input")
    ctx_input: dict[str, Any] = found if isinstance(found, dict) else {}
    found = ctx.get("data")
    ctx_data: dict[str, Any] = found if isinstance(found, dict) else {}
    sources = (provided, ctx_input, ctx_data, ctx)
    kwargs: dict[str, Any] = {}
    var_kwargs = False
    for name, kind, has_default in _parameters(fn):
        if kind == _VAR_POSITIONAL:
            raise _Failure("*args are not supported in python tasks")
        if kind == _VAR_KEYWORD:
            var_kwargs = True
            continue
        if kind == _POSITIONAL_ONLY:
            raise _Failure(f"main's parameter '{name}' is positional-only; python tasks pass arguments by name")
        if name == "context":
            kwargs["context"] = context
            continue
        for source in sources:
            if name in source:
                kwargs[name] = source[name]
                break
        else:
            if not has_default:
                raise _Failure(f"Missing required argument '{name}' for Python task. Provide it via args or context.")
    if var_kwargs:
        for source in (ctx_input, ctx_data, provided):
            for key, value in source.items():
                kwargs.setdefault(key, value)
    return kwargs


def _jsonable(value: object) -> Any:
    """What ``json`` cannot write, written as NoETL's serializers do (times as ISO 8601, the rest as text)."""
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    decimal = sys.modules.get("decimal")  # (a Decimal can only come from code that imported it)
    if decimal is not None and isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, (bytes, bytearray)):
        return binascii.b2a_base64(bytes(value), newline=False).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    return str(value)


_PROGRAMS: dict[str, types.CodeType] = {}
"""A worker's step programs, unmarshalled once each (a reused worker serves a run's steps of the same code
again): a code object is immutable, and each step still runs it in globals of its own."""

MAX_PROGRAMS = 64


def _program(text: str) -> types.CodeType:
    """The step's compiled code from its header's ``program`` (:func:`program_text`), unmarshalled once per
    worker."""
    program = _PROGRAMS.get(text)
    if program is None:
        if len(_PROGRAMS) >= MAX_PROGRAMS:
            _PROGRAMS.clear()
        program = _PROGRAMS[text] = marshal.loads(binascii.a2b_base64(text))
    return program


def _run(request: dict[str, Any]) -> Any:
    code = request["code"]
    context = request.get("context")
    if context is None:
        context = {}
    provided = request.get("input") or {}
    if not isinstance(provided, dict):
        raise _Failure(f"`input` must be an object, got {type(provided).__name__}")
    if request.get("coerce"):
        provided = {k: _coerce(v) for k, v in provided.items()}
    namespace: dict[str, Any] = {
        "__builtins__": builtins,
        "__name__": "__noetl_step__",
        "context": context,
        "os": os,
        "json": json,
        "datetime": datetime,
        "uuid": uuid,
    }
    namespace.update(provided)
    if "data" not in namespace and isinstance(context, dict):
        if "data" in context:
            namespace["data"] = context["data"]
        elif "result" in context:
            namespace["data"] = context["result"]
    before = dict(namespace)
    compiled = request.get("program")
    program = _program(compiled) if compiled else compile_step(code)
    exec(program, namespace)

    def bound(name: str) -> bool:
        return name in namespace and (name not in before or namespace[name] is not before[name])

    if bound("main") and callable(namespace["main"]):
        main = namespace["main"]
        value = main(**_kwargs(main, provided, context))
        if isinstance(value, types.CoroutineType):  # (``inspect.iscoroutine``)
            import asyncio  # imported while the worker waited (ASYNC_IMPORTS), unless the step was not seen to need it

            value = asyncio.run(value)
        return value
    if bound("result"):
        return namespace["result"]
    keys = [k for k in namespace if not k.startswith("__") and bound(k)]
    return {
        "status": "success",
        "message": "Code executed without explicit result variable",
        "locals_count": len(keys),
        "locals_keys": keys,
    }


def _error_line(tb: Any) -> int | None:
    line = None
    while tb is not None:  # (``traceback.walk_tb``)
        if tb.tb_frame.f_code.co_filename == FILENAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _user_traceback(e: BaseException) -> str:
    """The traceback from the step's code down (the worker's own frames left out)."""
    try:
        import traceback  # (at first use: a step that raised)
    except Exception:  # (no memory left to import it under the step's limit, say): the error says enough
        return ""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != FILENAME:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"ok": True, "result": _run(request)}
    except SystemExit as e:
        code = e.code
        return {
            "ok": False,
            "kind": "exit",
            "type": "SystemExit",
            "error": f"the code called sys.exit({code!r})" if code is not None else "the code called sys.exit()",
            "line": _error_line(e.__traceback__),
        }
    except _Failure as e:
        return {"ok": False, "kind": e.kind, "type": "TypeError", "error": str(e)}
    except SyntaxError as e:
        return {
            "ok": False,
            "kind": "syntax",
            "type": "SyntaxError",
            "error": f"SyntaxError: {e.msg}",
            "line": e.lineno if e.filename == FILENAME else None,
        }
    except MemoryError as e:
        return {
            "ok": False,
            "kind": "memory",
            "type": "MemoryError",
            "error": "MemoryError: the code ran out of memory",
            "line": _error_line(e.__traceback__),
        }
    except RecursionError as e:
        return {
            "ok": False,
            "kind": "error",
            "type": "RecursionError",
            "error": f"RecursionError: {e}",
            "text": str(e),
            "line": _error_line(e.__traceback__),
        }
    except BaseException as e:
        return {
            "ok": False,
            "kind": "error",
            "type": type(e).__name__,
            "error": f"{type(e).__name__}: {e}" if str(e) else type(e).__name__,
            "text": str(e),
            "line": _error_line(e.__traceback__),
            "traceback": _user_traceback(e)[-8000:],
        }


def _encode(reply: Mapping[str, object], max_bytes: int) -> bytes:
    try:
        data = json.dumps(reply, default=_jsonable, ensure_ascii=False, allow_nan=False).encode()
    except ValueError as e:  # NaN or infinity, or a circular reference
        data = json.dumps(
            {"ok": False, "kind": "result", "type": "ValueError", "error": f"the result is not JSON: {e}"}
        ).encode()
    except RecursionError:
        data = json.dumps(
            {"ok": False, "kind": "result", "type": "RecursionError", "error": "the result is nested too deeply"}
        ).encode()
    if max_bytes and len(data) > max_bytes:
        data = json.dumps(
            {
                "ok": False,
                "kind": "too_large",
                "type": "ValueError",
                "error": f"the result is {len(data)} bytes of JSON, more than the limit of {max_bytes}",
            }
        ).encode()
    return data


def handle(header: dict[str, Any], body: object) -> bytes:
    """One step in a sandbox worker (:mod:`mcpipe._sandbox`, role ``python``): ``header`` is fixed per step
    (``code``, ``coerce``, ``max_result_bytes``), ``body`` per call (``input``, ``context``); the reply's
    JSON."""
    request = {**header, **(body if isinstance(body, dict) else {})}
    return _encode(_answer(request), int(header.get("max_result_bytes") or 0))


def _sample() -> bytes:
    code = "def main(x, label):\n    return {'x': [x, str(x)], 'label': label}\n"
    header = json.dumps(
        {"code": code, "program": program_text(compile_step(code)), "coerce": False, "max_result_bytes": 0}
    ).encode()
    body = json.dumps({"env": {"PATH": "/usr/bin"}, "input": {"x": 1, "label": "a"}, "context": None}).encode()
    return struct.pack(">I", len(header)) + header + body


SAMPLE = _sample()
"""A trivial request, as the server frames one: the sandbox walks its whole path once in a fresh worker
while it waits (``_zygote._rehearse``), so that its page faults come then, not during the step."""
