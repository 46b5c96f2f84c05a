"""What a NoETL template sees, as NoETL's engine builds it (``ExecutionState.get_render_context``).

- ``workload``, ``ctx`` (and the older ``vars``): the playbook's ``workload``, the call's arguments laid over
  it (NoETL merges the execution request's payload the same way), then every ``set`` applied so far, in the
  order the steps finished (``ctx.x``, ``iter.x``, ``step.x`` and bare keys all write ``x``);
- every step's result by its name (``{{ fetch.data.rows }}``), and every variable by its bare name
  (``{{ message }}``); the reserved roots first, then step results, then variables, as NoETL orders them;
- in a loop: ``iter`` (the item under the iterator's name, ``_index``, ``_first``), the item by its bare
  name, and ``loop`` (``index``, ``first``);
- in a step's ``set`` and its arcs' ``when``: ``output`` (``{status: ok|error, data, error}``), ``event``
  (``{name: call.done|call.error|loop.done, step}``), ``result`` and ``error``;
- in a task of a pipeline: ``_prev``, ``_task``, ``_attempt``, ``results`` and ``output``;
- ``execution_id``, ``job`` (``uuid``, ``execution_id``, ``id``), ``keychain.NAME`` (the ``keychain``
  entries) and ``env.NAME`` (NoETL's own environment variables, ``NOETL_*`` and ``POSTGRES_*``).

A step result is a :class:`Result`: a dict whose missing ``data``, ``result`` and ``context`` attributes are
the result itself, so ``{{ step.data.x }}`` reads ``x`` whether or not the tool wrapped it (NoETL's
``TaskResultProxy``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from mcpipe.results import StepFailure

__all__ = ["SET_FACT", "Environ", "Keychain", "Result", "apply_set", "loop_result", "loop_runs", "output_view", "wrap"]

SET_FACT = "noetl_set"
"""The field of a step's result (in mcpipe's answer) holding the variables its ``set`` wrote."""

_ALIASES = frozenset({"data", "result", "context"})


class Result(dict[str, Any]):
    """A step's result as templates see it: ``{{ r.x }}`` reads key ``x`` (before any dict method of that
    name: ``{{ r.items }}`` is the key ``items``, as NoETL reads it); a missing ``data``, ``result`` or
    ``context`` is the result itself (NoETL's ``TaskResultProxy``); nested objects are results too."""

    __slots__ = ()

    def __getattribute__(self, name: str) -> Any:
        if name[:1] != "_" and dict.__contains__(self, name):
            return wrap(dict.__getitem__(self, name))
        return super().__getattribute__(name)

    def __getattr__(self, name: str) -> Any:
        if name in _ALIASES:
            return self
        raise AttributeError(name)

    def __getitem__(self, key: Any) -> Any:
        return wrap(dict.__getitem__(self, key))


# Jinja names a value's type in its messages (`'result object' has no attribute 'x'`).
Result.__module__ = "builtins"
Result.__name__ = "result"


def wrap(value: object) -> Any:
    """``value`` as templates see it (a dict becomes a :class:`Result`)."""
    if type(value) is dict:
        return Result(value)
    return value


def apply_set(variables: dict[str, Any], mutations: Mapping[str, object]) -> None:
    """NoETL's ``_apply_set_mutations``: ``ctx.x``, ``iter.x``, ``step.x`` and ``x`` all write ``x``."""
    for key, value in mutations.items():
        scope, dot, bare = key.partition(".")
        variables[bare if dot and scope in ("ctx", "iter", "step") else key] = value


def output_view(result: object, ok: bool, error: object) -> dict[str, Any]:
    """NoETL's ``output`` of a finished step (``_build_output_view``): ``status`` (``ok``/``error``),
    ``data`` (the result's ``data``, else the result), ``error``, and ``http``/``context`` when the
    result has them."""
    out: dict[str, Any] = {"status": "ok" if ok else "error", "data": None, "ref": None, "error": error}
    if isinstance(result, Mapping):
        if result.get("status") in ("error", "failed"):
            out["status"] = "error"
        if result.get("error") is not None:
            out["error"] = result.get("error")
        out["data"] = result.get("data", result)
        for key in ("http", "pg", "py", "meta", "context"):
            if key in result:
                out[key] = result[key]
    elif result is not None:
        out["data"] = result
    return out


def loop_runs(r: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A loop step's runs of its items (those that started, in item order), from its result in the run."""
    return [ch for ch in r.get("children") or [] if ch is not None]


def loop_result(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A loop step's result once every iteration is done: each successful iteration's result in order, and
    counts."""
    outputs = [ch.get("output") for ch in runs if ch.get("ok")]
    failed = len(runs) - len(outputs)
    return {"results": outputs, "stats": {"total": len(outputs), "success": len(outputs) - failed, "failed": failed}}


class Environ(Mapping[str, str]):
    """``env.NAME``: NoETL's own environment variables (``NOETL_*``, ``POSTGRES_*``), read when used; any
    other name is refused (the server's environment is not the playbook's)."""

    PREFIXES = ("NOETL_", "POSTGRES_")

    def __getitem__(self, name: str) -> str:
        if not name.startswith(self.PREFIXES):
            raise KeyError(f"env.{name}: only NoETL's variables (NOETL_*, POSTGRES_*) can be read")
        value = os.environ.get(name)
        if value is None:
            raise KeyError(f"env.{name}: the environment variable {name} is not set")
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def secret_value(name: str) -> Any:
    """A credential or secret NoETL would read from its store, from the variable NoETL falls back to:
    ``NOETL_SECRET_<NAME>`` (upper case, ``/`` and ``-`` as ``_``), a JSON object read as its fields."""
    var = "NOETL_SECRET_" + name.upper().replace("/", "_").replace("-", "_")
    value = os.environ.get(var)
    if value is None:
        raise StepFailure(f"credential `{name}`: set {var} (NoETL's credential store is not mcpipe's)", "TOOL_FAILED")
    if value[:1] == "{":
        with contextlib.suppress(orjson.JSONDecodeError):
            return orjson.loads(value)
    return value


class Keychain(Mapping[str, Any]):
    """``keychain.NAME``: a ``keychain`` entry of the playbook, resolved when a template reads it: a
    ``static`` entry's ``map``, a ``bearer`` entry's ``token`` (both rendered), and every other kind
    (``credential``, ``secret_manager``, ``oauth2``, ...) from ``NOETL_SECRET_<NAME>``."""

    def __init__(self, entries: Mapping[str, Mapping[str, object]], render: Callable[[object], object]) -> None:
        self._entries = entries
        self._render = render
        self._cache: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name in self._cache:
            return self._cache[name]
        entry = self._entries.get(name)
        if entry is None:
            raise KeyError(f"keychain.{name}: no keychain entry `{name}`")
        kind = entry.get("kind", entry.get("type"))
        if kind == "static":
            value: Any = self._render(entry.get("map") or {})
        elif kind == "bearer":
            value = {"token": self._render(entry.get("token"))}
        else:
            try:
                value = secret_value(name)
            except StepFailure as e:
                raise KeyError(f"keychain.{name}: {e}") from None
            if not isinstance(value, Mapping):
                value = {"value": value, "token": value, "api_key": value}
        self._cache[name] = wrap(value)
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
