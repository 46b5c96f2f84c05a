"""The ``store_content`` step kind: the resolved ``data`` stored in a content store; the output is where it can be
read (its URI, a resource clients read) and what it is (``docs/declared-pipelines.md``)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
import orjson

from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "StoreContentFields", "run_store_content"]


class StoreContentFields(StepFields, tag="store_content"):
    """Store ``data`` (a template) in the content store ``store`` (default: the config's default store)."""

    data: Any
    encoding: Literal["text", "base64", "json"] = "text"
    """How ``data`` becomes bytes: a string as UTF-8 (``text``), base64 decoded (``base64``), or any value as
    JSON (``json``)."""
    mime_type: str | None = None
    """Default: ``application/json`` for ``json``, else ``text/plain`` (``application/octet-stream`` for base64)."""
    store: str | None = None
    ttl_ms: Annotated[float, msgspec.Meta(gt=0)] | None = None
    """After this it is gone (default: kept until the store needs the room)."""
    alias: str | None = None
    """A name to read it by besides its hash: ``alias:<session>:<alias>`` (``alias:~<principal>:<alias>`` for a
    caller without a session, ``alias:__no_session__:<alias>`` for one without either); an alias another
    session or principal holds is refused."""


def build_store_content(b: Build[StoreContentFields]) -> Any:
    """The content stores the step writes to (the policy's)."""
    f = b.fields
    if f is None:
        b.fail()
    content = b.policy.content
    if content is None:
        b.problem(f"{b.location}.kind", "a store_content step needs a content store (the `content` section)")
    elif f.store is not None and f.store not in content.stores:
        b.problem(f"{b.location}.store", f"no content store `{f.store}` ({', '.join(sorted(content.stores))})")
    return content


async def run_store_content(
    step: Leaf[StoreContentFields, Any], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Store the data, owned by the caller's session and principal (only they may read it); answers ``{uri, id,
    size_bytes, mime_type, content_hash, expires_at}``."""
    f = step.fields
    data = inputs["data"]
    if f.encoding == "json":
        raw, mime = orjson.dumps(data), "application/json"
    elif not isinstance(data, str):
        raise StepFailure(f"data must be a string to store as {f.encoding}", ErrorCode.INVALID_OUTPUT)
    elif f.encoding == "base64":
        try:
            raw, mime = base64.b64decode(data, validate=True), "application/octet-stream"
        except (binascii.Error, ValueError):
            raise StepFailure("data is not base64", ErrorCode.INVALID_OUTPUT) from None
    else:
        raw, mime = data.encode(), "text/plain"
    from mcpipe.store.content import AliasTaken, ContentTooLarge

    stores = step.built
    try:
        uri, stored = await stores.put(
            raw, f.mime_type or mime, store=f.store, ttl_s=f.ttl_ms / 1000 if f.ttl_ms else None, alias=f.alias,
            session_id=ctx.request.session_id, tenant_id=ctx.principal,
        )  # fmt: skip
    except AliasTaken as e:
        raise StepFailure(str(e), ErrorCode.FORBIDDEN) from None
    except (ContentTooLarge, OSError) as e:
        raise StepFailure(f"storing the content failed: {e}", ErrorCode.TOOL_FAILED) from None
    expires = stored.expires_at.isoformat().replace("+00:00", "Z") if stored.expires_at is not None else None
    return StepOutput.of(
        {
            "uri": uri,
            "id": stored.id,
            "size_bytes": stored.size_bytes,
            "mime_type": stored.mime_type,
            "content_hash": stored.content_hash,
            "expires_at": expires,
        }
    )


KIND = Kind("store_content", StoreContentFields, run_store_content, templates=("data",), build=build_store_content)
