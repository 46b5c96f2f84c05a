"""The worker process of ``python`` steps: runs one step's code, then exits (see :mod:`mcpipe.kinds._pyworker`).

Run as a script (``python -I _pyexec.py RESULT_FD``, or forked by the fork server, ``python -I _pyexec.py
--fork-server SOCKET_FD``: :func:`fork_server`), it imports nothing of mcpipe. It waits for one
request on stdin (a JSON object: the code, its input and context as data, the limits), lowers its own
limits (address space, CPU time, core dumps), runs the code with NoETL's semantics, and writes one JSON
reply on the result pipe (``RESULT_FD``): ``{"ok": true, "result": ...}`` or ``{"ok": false, "error",
"type", "line", "traceback"}``. The code's stdout and stderr are the process's own, read (bounded) by the
parent. The caller's values reach the code only as data decoded from the request, never as code.

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

import ast
import base64
import builtins
import datetime
import decimal
import inspect
import json
import os
import resource
import sys
import traceback
import uuid
from typing import Any

FILENAME = "<python step>"


class _Failure(Exception):
    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


def _limit(which: int, soft: int) -> None:
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(which, (soft, hard))


def _apply_limits(request: dict[str, Any]) -> None:
    memory = request.get("memory_bytes")
    if memory:
        _limit(resource.RLIMIT_AS, int(memory))
    cpu = request.get("cpu_seconds")
    if cpu:
        used = resource.getrusage(resource.RUSAGE_SELF)
        spent = int(used.ru_utime + used.ru_stime) + 1
        _limit(resource.RLIMIT_CPU, spent + int(cpu))


def _coerce(value: Any) -> Any:
    """NoETL's ``_coerce_param``: a string holding a JSON or Python object or array literal, decoded."""
    if isinstance(value, str):
        s = value.strip()
        if (s.startswith("{") and s.endswith("}")) or (s.startswith("[") and s.endswith("]")):
            try:
                return json.loads(s)
            except ValueError:
                try:
                    return ast.literal_eval(s)
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    return value
    return value


def _kwargs(fn: Any, provided: dict[str, Any], context: Any) -> dict[str, Any]:
    """NoETL's ``_build_call_kwargs``: ``main``'s arguments by name."""
    ctx: dict[str, Any] = context if isinstance(context, dict) else {}
    found = ctx.get("input")
    ctx_input: dict[str, Any] = found if isinstance(found, dict) else {}
    found = ctx.get("data")
    ctx_data: dict[str, Any] = found if isinstance(found, dict) else {}
    sources = (provided, ctx_input, ctx_data, ctx)
    kwargs: dict[str, Any] = {}
    var_kwargs = False
    for param in inspect.signature(fn).parameters.values():
        if param.kind == inspect.Parameter.VAR_POSITIONAL:
            raise _Failure("*args are not supported in python tasks")
        if param.kind == inspect.Parameter.VAR_KEYWORD:
            var_kwargs = True
            continue
        if param.kind == inspect.Parameter.POSITIONAL_ONLY:
            raise _Failure(f"main's parameter '{param.name}' is positional-only; python tasks pass arguments by name")
        if param.name == "context":
            kwargs["context"] = context
            continue
        for source in sources:
            if param.name in source:
                kwargs[param.name] = source[param.name]
                break
        else:
            if param.default is inspect.Parameter.empty:
                raise _Failure(
                    f"Missing required argument '{param.name}' for Python task. Provide it via args or context."
                )
    if var_kwargs:
        for source in (ctx_input, ctx_data, provided):
            for key, value in source.items():
                kwargs.setdefault(key, value)
    return kwargs


def _jsonable(value: Any) -> Any:
    """What ``json`` cannot write, written as NoETL's serializers do (times as ISO 8601, the rest as text)."""
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    return str(value)


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
    program = compile(code, FILENAME, "exec")
    exec(program, namespace)

    def bound(name: str) -> bool:
        return name in namespace and (name not in before or namespace[name] is not before[name])

    if bound("main") and callable(namespace["main"]):
        main = namespace["main"]
        value = main(**_kwargs(main, provided, context))
        if inspect.iscoroutine(value):
            import asyncio

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
    for frame, lineno in traceback.walk_tb(tb):
        if frame.f_code.co_filename == FILENAME:
            line = lineno
    return line


def _user_traceback(e: BaseException) -> str:
    """The traceback from the step's code down (the worker's own frames left out)."""
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


def _encode(reply: dict[str, Any], max_bytes: int) -> bytes:
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


def serve_one(result_fd: int) -> None:
    """Run one request: read it from stdin, answer on ``result_fd``, exit."""
    os.set_inheritable(result_fd, False)  # what the code starts does not hold the reply pipe
    out = os.fdopen(result_fd, "wb", buffering=0)
    raw = sys.stdin.buffer.read()
    # The code reads an empty stdin.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if not raw:
        os._exit(0)  # the parent stopped
    request = json.loads(raw)
    env = request.get("env")
    if isinstance(env, dict):
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
    _apply_limits(request)
    reply = _answer(request)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # the code closed them
        pass
    data = _encode(reply, int(request.get("max_result_bytes") or 0))
    view = memoryview(data)
    while view:
        view = view[out.write(view) or 0 :]
    out.close()
    os._exit(0)


def fork_server(sock_fd: int) -> None:
    """The fork server: one process that has imported what a step needs and never runs a step's code
    itself, forking a fresh child per step (milliseconds, where starting Python takes tens).

    Its parent speaks over a Unix socket, one JSON message each way: ``{"op": "fork", "cwd"}`` with four
    file descriptors attached (the child's stdin, stdout, stderr and reply pipe) answers ``{"pid"}``: a child
    in a session of its own, which runs :func:`serve_one`; ``{"op": "reap", "pid"}`` kills the child's
    process group and reaps the child, answering ``{"code"}`` (its exit status; negative: the signal). A
    child is reaped only when asked, so its process group id cannot be reused before the group is killed.
    The server exits when its parent closes the socket."""
    import asyncio  # noqa: F401  # imported once here, for every child's `async def main`
    import signal
    import socket

    sock = socket.socket(fileno=sock_fd)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 65536, 4)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)
        cmd = json.loads(msg)
        if cmd["op"] == "fork":
            pid = os.fork()
            if pid == 0:
                sock.close()
                os.setsid()
                for target, fd in zip((0, 1, 2), fds[:3], strict=True):
                    os.dup2(fd, target)
                    os.close(fd)
                os.chdir(cmd["cwd"])
                serve_one(fds[3])
            for fd in fds:
                os.close(fd)
            sock.sendall(json.dumps({"pid": pid}).encode())
        elif cmd["op"] == "reap":
            pid = int(cmd["pid"])
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                _, status = os.waitpid(pid, 0)
                code: int | None = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                code = None
            sock.sendall(json.dumps({"code": code}).encode())


def main() -> None:
    if sys.argv[1] == "--fork-server":
        fork_server(int(sys.argv[2]))
    else:
        serve_one(int(sys.argv[1]))


if __name__ == "__main__":
    main()
