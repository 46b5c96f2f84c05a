"""mcpg's OpenAPI backend plugin (``dev.mcpg.backend.openapi``) as mcpg's docs describe it: its sources are
``[openapi.NAME]`` sections, a binding of kind ``openapi`` serves its operation under the binding's name, and a
source with ``expose.tools`` serves every operation its filter lets through. The case file is served against
the stand-in that checks every request against the document."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp.shared.exceptions import MCPError

from kit.openapi_standin import DOCUMENTS, read, standin
from kit.servers import http_server
from mcpipe.config import load_config, parse_config
from mcpipe.formats.mcpg.plugins import env_credential_variable
from mcpipe.server import open_app

HERE = Path(__file__).parent


def _asserting_client(url: str) -> Any:
    """An SDK client calling as a header-asserted subject (``x-mcpg-subject-id``), as mcpg's bindings require."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    @asynccontextmanager
    async def transport() -> AsyncIterator[Any]:
        headers = {"x-mcpg-subject-id": "tester"}
        async with create_mcp_http_client(headers=headers) as http, streamable_http_client(url, http_client=http) as s:
            yield s

    return Client(transport())


UPSTREAM = HERE / "upstream"


def test_mcpgs_documented_openapi_plugin_config_loads_as_an_openapi_section() -> None:
    key = env_credential_variable("vault-api", "petstore")
    text = (UPSTREAM / "docs" / "backends.md@L703.yaml").read_text()
    config = parse_config(text, "yaml", environ={key: "secret"})
    section = config.openapi["petstore"]
    assert (
        section.spec == "file:///etc/mcpg/specs/petstore.yaml"
        and section.base_url == "https://api.petstore.example.com"
    )
    assert section.auth["apiKeyAuth"].credential == "vault-api/petstore"
    assert config.credentials["vault-api/petstore"].env == key  # type: ignore[union-attr]
    assert section.include is not None and section.include.operations == []  # no binding names an operation


async def test_the_mcpg_openapi_case_serves_its_binding_and_its_exposed_source_against_the_stand_in(
    tmp_path: Path, monkeypatch: Any
) -> None:
    key = env_credential_variable("vault-api", "petstore")
    monkeypatch.setenv(key, "special-key")
    with trio.fail_after(60):
        async with standin(read("swagger-petstore-3.0.yaml"), prefix="/api/v3") as api:
            env = {
                key: "special-key",
                "PETSTORE_SPEC": (DOCUMENTS / "swagger-petstore-3.0.yaml").as_uri(),
                "PETSTORE_URL": api.url,
            }
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            config = load_config(str(HERE / "cases" / "openapi.yaml"))
            async with open_app(config) as app, http_server(app) as url, _asserting_client(url) as client:
                listed = {
                    t.name: t.model_dump(by_alias=True, exclude_none=True) for t in (await client.list_tools()).tools
                }
                pet = await client.call_tool("pets.get", {"petId": 5})
                order = await client.call_tool("shop.getOrderById", {"orderId": 2})
                with pytest.raises(MCPError, match="unknown tool"):  # the bound operation is the binding's alone
                    await client.call_tool("mcpg.openapi.petstore.getPetById", {"petId": 5})
    served = sorted(n for n in listed if n != "mcp_pipe")
    assert served == ["pets.get", "shop.getOrderById", "shop.placeOrder"]  # deleteOrder denied, others not allowed
    assert listed["pets.get"]["description"] == "One pet, by its id."
    assert listed["pets.get"]["inputSchema"]["required"] == ["petId"]  # the operation's schema, as mcpg derives it
    assert not pet.is_error and (pet.structured_content or {})["path"] == "/api/v3/pet/5"
    assert not order.is_error
    assert not api.invalid and [s.operation for s in api.seen] == ["getPetById", "getOrderById"]
    assert api.seen[0].headers["api_key"] == "special-key"  # the source's auth, by the scheme's name
