"""The large real documents (GitHub's REST description, Stripe's API, Kubernetes' API) load, checked by
openapi-spec-validator, with every operation served or refused with its reason; and a sample of their
operations (every n-th tool, in document order), called through a real MCP client over HTTP with arguments
their input schemas accept, reaches a stand-in that checks each request against the document."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from kit.clients import bearer_client
from kit.openapi_standin import DOCUMENTS, read, standin
from kit.schema_instances import instance
from kit.servers import http_server, make_config
from mcpipe.server import open_app


def _api(app: Any) -> Any:
    return next(s for s in app.gateway.sources if hasattr(s, "apis")).apis[0]


def _param_read_only(tool: Any) -> bool:
    """GitHub marks a few path parameters' schemas ``readOnly`` (``alert_number``): openapi-core then refuses
    any value, whatever the client sends."""
    defs = tool.input_schema.get("$defs", {})
    for prop in tool.input_schema["properties"].values():
        target = defs.get(prop.get("$ref", "").rsplit("/", 1)[-1], prop) if isinstance(prop, dict) else {}
        if isinstance(target, dict) and target.get("readOnly"):
            return True
    return False


def _nested_form(tool: Any) -> bool:
    """A form body whose generated arguments hold a nested object: openapi-core does not read those back."""
    body = tool.op.body
    if body is None or body.encoding != "form":
        return False
    value = instance(tool.input_schema).get(body.arg)
    return isinstance(value, dict) and any(isinstance(v, dict | list) for v in value.values())


CASES = {
    # name: (file, base path, tools, refused, what the validator says, auth, sample step)
    "github": ("github-api.github.com.json.gz", "", 874, 0, 3, {}, 10),
    "stripe": ("stripe-spec3.json.gz", "", 417, 0, 0, {"bearerAuth": {"credential": "key"}}, 5),
    "kubernetes": ("kubernetes-swagger.json.gz", "", 1123, 0, 0, {"BearerToken": {"credential": "key"}}, 10),
}


@pytest.mark.parametrize("name", CASES)
async def test_a_large_real_document_loads_and_its_sampled_calls_are_requests_the_document_accepts(
    name: str, monkeypatch: Any
) -> None:
    spec, prefix, n_tools, n_refused, n_problems, auth, step = CASES[name]
    key = "Bearer k8s-token" if name == "kubernetes" else "sk_test_key"
    monkeypatch.setenv("API_KEY", key)
    with trio.fail_after(240):
        async with standin(read(spec), prefix=prefix) as api:
            config = make_config(
                {"API_KEY": key},
                openapi={name: {"spec": str(DOCUMENTS / spec), "base_url": api.url, "auth": auth}},
                credentials={"key": {"kind": "env", "env": "API_KEY"}},
            )
            async with open_app(config) as app:
                loaded = _api(app)
                tools = list(loaded.tools.values())[::step]
                sample = [t for t in tools if not _param_read_only(t) and not _nested_form(t)]
                async with http_server(app) as url, bearer_client(url, None) as client:
                    results = [await client.call_tool(t.name, instance(t.input_schema)) for t in sample]
    assert (len(loaded.tools), len(loaded.refused), len(loaded.problems)) == (n_tools, n_refused, n_problems)
    assert [r.content[0].text[:300] for r in results if r.is_error] == []
    assert len(api.seen) == len(sample) >= len(tools) - 5
    assert not api.invalid, [(s.method, s.path, s.errors) for s in api.invalid][:5]
    assert [s.operation for s in api.seen] == [t.op.operation_id for t in sample]
    if auth:
        assert all(
            s.headers.get("authorization") == ("Bearer sk_test_key" if name == "stripe" else key) for s in api.seen
        )
