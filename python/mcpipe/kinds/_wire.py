"""What the messaging and RPC kinds (``nats``, ``grpc``, ``kafka``) share: payloads on the wire, deadlines.

Each runs on a connection shared per server URL (:class:`mcpipe.backends._connections.Connections`, in the
step policy), opened on first use and closed when the server stops. A payload left out is the step's input
(``args``, after ``input_transform``), as in mcpg, whose backend steps send their input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from mcpipe._describe import json_type
from mcpipe._template import Template
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build
from mcpipe.results import StepFailure

__all__ = ["DEFAULT_TIMEOUT_MS", "address", "decode", "encode", "object_of", "payload", "text_of", "timeout_s"]

DEFAULT_TIMEOUT_MS = 30_000.0


def encode(value: object) -> bytes:
    """A payload on the wire: a string as UTF-8 text, anything else as JSON."""
    return value.encode() if isinstance(value, str) else orjson.dumps(value)


def decode(data: bytes) -> Any:
    """A reply as a value: JSON when it parses, else text."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode(errors="replace")


def address(b: Build[Any], name: str, parse: Callable[[str], object]) -> str:
    """Field ``name``, a server address checked by ``parse`` (its ``ValueError`` is the located problem);
    fails the build when it is not a string (the fields' decoding reports that) or does not parse."""
    value = b.raw.get(name)
    if not isinstance(value, str):
        b.fail()
    try:
        parse(value)
    except ValueError as e:
        b.problem(f"{b.location}.{name}", str(e))
        b.fail()
    return value


def payload(b: Build[Any], name: str) -> Template:
    """The template of field ``name`` (default: the step's input, ``args``); fails the build on a problem."""
    if name not in b.raw:
        return Template({"$ref": "args"})
    t = b.template(b.raw[name], f"{b.location}.{name}")
    if t is None:
        b.fail()
    return t


def timeout_s(b: Build[Any]) -> float:
    """The step's own deadline in seconds (``timeout_ms``, default 30 s)."""
    ms = b.fields.timeout_ms if b.fields is not None and b.fields.timeout_ms is not None else DEFAULT_TIMEOUT_MS
    return ms / 1000


def object_of(value: object, name: str) -> Mapping[str, Any]:
    """``value`` (headers, metadata) as an object; empty when null."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise StepFailure(f"`{name}` must be an object, got {json_type(value)}", ErrorCode.TOOL_FAILED)
    return value


def text_of(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise StepFailure(f"`{name}` must be a non-empty string, got {json_type(value)}", ErrorCode.TOOL_FAILED)
    return value
