"""Content stores: a pipeline's ``store_content`` step stores bytes, a client reads them back as a resource over
streamable HTTP (text as text, the rest base64), for as long as they live; a file store keeps mcpg's layout."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import blake3
import pytest
import trio

from kit.clients import bearer_client
from kit.servers import http_server
from mcpipe.config import ConfigError, parse_config
from mcpipe.server import open_app

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def _doc(root: Path, **step: Any) -> dict[str, Any]:
    return {
        "audit": {"enabled": False},
        "builtins": False,
        "content": {"stores": {"files": {"kind": "file_system", "root": str(root)}, "mem": {}}, "default": "files"},
        "pipelines": [
            {
                "name": "report",
                "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
                "steps": [{"kind": "store_content", "id": "put", "data": "${args.text}", **step}],
            }
        ],
    }


def _config(doc: dict[str, Any]) -> Any:
    return parse_config(json.dumps(doc), "json", environ={})


async def test_stored_text_is_read_back_as_a_resource_and_lies_on_disk_in_mcpgs_layout(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with (
            open_app(_config(_doc(tmp_path, mime_type="text/csv", alias="weekly"))) as app,
            http_server(app) as url,
            bearer_client(url, None) as client,
        ):
            stored = (await client.call_tool("report", {"text": "day,sales\nmon,3\n"})).structured_content or {}
            read = await client.read_resource(stored["uri"])
            by_alias = await client.read_resource("mcpipe-content://alias:__no_session__:weekly")
    digest = blake3.blake3(b"day,sales\nmon,3\n").hexdigest()
    assert (
        stored["uri"] == "mcpipe-content://alias:__no_session__:weekly" and stored["content_hash"] == f"blake3:{digest}"
    )
    assert read.contents[0].text == "day,sales\nmon,3\n" and read.contents[0].mime_type == "text/csv"  # type: ignore[union-attr]
    assert by_alias.contents[0].text == "day,sales\nmon,3\n"  # type: ignore[union-attr]
    assert (tmp_path / "blobs" / digest[:2] / digest[2:4] / digest).read_bytes() == b"day,sales\nmon,3\n"
    meta = json.loads((tmp_path / "meta" / digest[:2] / digest[2:4] / f"{digest}.json").read_text())
    assert meta["mime_type"] == "text/csv" and meta["size_bytes"] == 16 and meta["stored_at"].endswith("Z")


async def test_binary_content_is_a_blob_expired_or_foreign_session_content_is_an_unknown_resource(
    tmp_path: Path,
) -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
    doc = _doc(tmp_path, encoding="base64", mime_type="image/png", store="mem", ttl_ms=300)
    # A file another session stored (as mcpg tags what a session's call produced): no one else may read it.
    other = blake3.blake3(b"secret").hexdigest()
    (tmp_path / "blobs" / other[:2] / other[2:4]).mkdir(parents=True)
    (tmp_path / "blobs" / other[:2] / other[2:4] / other).write_bytes(b"secret")
    (tmp_path / "meta" / other[:2] / other[2:4]).mkdir(parents=True)
    meta = {"mime_type": "text/plain", "stored_at": "2026-01-01T00:00:00Z", "session_id": "someone", "size_bytes": 6}
    (tmp_path / "meta" / other[:2] / other[2:4] / f"{other}.json").write_text(json.dumps(meta))
    with trio.fail_after(30):
        async with open_app(_config(doc)) as app, http_server(app) as url, bearer_client(url, None) as client:
            stored = (await client.call_tool("report", {"text": png})).structured_content or {}
            blob = await client.read_resource(stored["uri"])
            await trio.sleep(0.4)
            with pytest.raises(Exception, match="unknown resource"):
                await client.read_resource(stored["uri"])
            with pytest.raises(Exception, match="unknown resource"):
                await client.read_resource(f"mcpipe-content://hash:{other}")
    assert stored["uri"].startswith("mcpipe-content://mem/hash:")
    assert blob.contents[0].blob == png  # type: ignore[union-attr]


def test_a_store_content_step_without_a_store_or_naming_an_unknown_one_is_refused_located(tmp_path: Path) -> None:
    doc = _doc(tmp_path, store="nope")
    with pytest.raises(ConfigError) as e:
        _config(doc)
    assert [(p.location, p.message) for p in e.value.problems] == [
        ("pipelines.report.steps[0].store", "no content store `nope` (files, mem)")
    ]
