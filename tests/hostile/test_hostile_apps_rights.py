"""A fourth hostile review: MCP Apps' ``_meta.ui`` policy under a hostile downstream, and a caller without rights
reaching the config's own prompts and templates (completions, listings) and a downstream's resource updates
(a 2026-07-28 ``subscriptions/listen`` stream), over streamable HTTP (``docs/reliability.md``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio

from kit.clients import bearer_client
from kit.servers import http_server, make_config
from mcpipe.server import open_app
from mcpipe.server._apps import AppsPolicy

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

APPS_DOWNSTREAM = str(Path(__file__).with_name("apps_downstream.py"))

# --- MCP Apps ------------------------------------------------------------------------------------------------

HOSTILE_UI = {
    "ui": {
        "csp": {
            # A host's connectDomains.join(" ") flattens the nested list into the policy.
            "connectDomains": ["https://a.example", ["https://evil.example"]],
            "resourceDomains": "https://evil.example",  # a string, not a list
            "scriptDirectives": ["'unsafe-inline'"],  # no axis the policy bounds
        },
        "permissions": ["camera"],  # a list, not an object
        "domain": ["evil.example"],  # not a string
    },
    "openai/widgetCSP": {"connect_domains": "https://evil.example"},
    "openai/widgetDomain": {"host": "evil.example"},
}
NARROWED = {"ui": {"csp": {"connectDomains": ["https://a.example"]}}, "openai/widgetCSP": {}}


def _apps_config(strict: bool = False) -> Any:
    apps = {
        "enabled": True,
        "strict": strict,
        "csp_policy": {"connect_domains": ["https://a.example"], "resource_domains": ["https://cdn.example"]},
        "allowed_permissions": ["clipboardWrite"],
        "allowed_domains": ["trusted.example"],
    }
    downstream = {"command": sys.executable, "args": [APPS_DOWNSTREAM], "env": {"UI_META": json.dumps(HOSTILE_UI)}}
    return make_config(apps=apps, mcpServers={"w": downstream})


async def test_a_downstreams_ill_typed_ui_meta_is_dropped_not_passed_to_the_host() -> None:
    # Before: every ill-typed policy field passed through as it came, and strict mode saw no violation.
    with trio.fail_after(30):
        async with open_app(_apps_config()) as app, http_server(app) as url, bearer_client(url, None) as c:
            listed = next(r for r in (await c.list_resources()).resources if r.uri == "ui://w/app")
            read = (await c.read_resource("ui://w/app")).contents[0]
        async with open_app(_apps_config(strict=True)) as app, http_server(app) as url, bearer_client(url, None) as c:
            with pytest.raises(Exception, match=r"MCP Apps strict mode: 'ui://w/app' _meta\.ui escaped"):
                await c.read_resource("ui://w/app")
    assert listed.meta == NARROWED and read.meta == NARROWED


def test_exact_match_holds_against_lookalike_csp_entries() -> None:
    # Probes that held (the policy matches whole strings; only the operator's "*" widens): kept as regressions.
    import msgspec

    from mcpipe.config import AppsConfig

    policy = AppsPolicy(msgspec.convert({"csp_policy": {"connect_domains": ["https://a.example"]}}, AppsConfig))
    lookalikes = [
        "https://*", "*.example", "HTTPS://A.EXAMPLE", "https://evil@a.example", "https://a.example.",
        "https://a.example:8443", "https://xn--a-0ga.example", "data:", "javascript:", "blob:",
        "https://a.example https://evil.example", "https://a.example;script-src *",
    ]  # fmt: skip
    meta: dict[str, Any] = {"ui": {"csp": {"connectDomains": ["https://a.example", *lookalikes]}}}
    violations = policy.clamp(meta)
    assert meta == {"ui": {"csp": {"connectDomains": ["https://a.example"]}}} and violations
    wildcard: dict[str, Any] = {"ui": {"csp": {"connectDomains": ["*"]}}}
    policy.clamp(wildcard)
    assert wildcard["ui"]["csp"]["connectDomains"] == ["https://a.example"]  # narrowed, never widened


# --- rights ----------------------------------------------------------------------------------------------------

CITIES = ["Paris", "Parma", "Perth"]


def _rights_doc(**extra: Any) -> dict[str, Any]:
    template = {
        "name": "city",
        "surface": "resource_template",
        "uri_template": "city://{name}",
        "steps": [{"kind": "value", "id": "v", "value": "${args.name}"}],
        "completions": {"name": {"pipeline": "city.names"}},
    }
    names = {
        "name": "city.names",
        "surface": "hidden",
        "steps": [{"kind": "transform", "id": "m", "expression": f"{json.dumps(CITIES)}.filter(c, true)"}],
    }
    prompt = {
        "name": "plan",
        "surface": "prompt",
        "arguments": [{"name": "code", "required": True}],
        "steps": [{"kind": "value", "id": "v", "value": "${args.code}"}],
        "completions": {"code": ["launch-1234", "launch-5678"]},
    }
    return {"audit": {"enabled": False}, "pipelines": [template, names, prompt], **extra}


async def _surfaces(url: str, token: str | None) -> tuple[list[str], list[str], list[list[str] | str]]:
    template = types.ResourceTemplateReference(type="ref/resource", uri="city://{name}")
    prompt = types.PromptReference(type="ref/prompt", name="plan")
    completed: list[list[str] | str] = []
    async with bearer_client(url, token) as c:
        templates = [t.uri_template for t in (await c.list_resource_templates()).resource_templates]
        prompts = [p.name for p in (await c.list_prompts()).prompts]
        for ref, arg in ((template, "name"), (prompt, "code")):
            try:
                completed.append((await c.complete(ref, {"name": arg, "value": ""})).completion.values)
            except Exception as exc:
                completed.append(str(exc))
    return templates, prompts, completed


async def test_a_caller_without_rights_neither_lists_nor_completes_the_configs_prompts_and_templates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: completion/complete ran the template's completion source (and answered the prompt's values) for a
    # token whose tools leave them out, and the trust rules did not filter prompts/list or templates/list.
    monkeypatch.setenv("TOK_ALICE", "alice-secret")
    monkeypatch.setenv("TOK_BOB", "bob-secret")
    tokens = {
        "tokens": [
            {"env": "TOK_ALICE", "principal": "alice", "tools": ["echo"]},
            {"env": "TOK_BOB", "principal": "bob", "tools": ["*"]},
        ]
    }
    by_tokens = make_config({"TOK_ALICE": "alice-secret", "TOK_BOB": "bob-secret"}, auth=tokens, **_rights_doc())
    trust = {"tools": {"city": {"minimum_trust": "verified"}, "plan": {"minimum_trust": "verified"}}}
    by_trust = make_config(trust=trust, **_rights_doc())
    with trio.fail_after(30):
        async with open_app(by_tokens) as app, http_server(app) as url:
            alice = await _surfaces(url, "alice-secret")
            bob = await _surfaces(url, "bob-secret")
        async with open_app(by_trust) as app, http_server(app) as url:
            anonymous = await _surfaces(url, None)
    assert bob[0] == ["city://{name}"] and "plan" in bob[1]
    assert bob[2] == [CITIES, ["launch-1234", "launch-5678"]]
    for refused in (alice, anonymous):
        templates, prompts, completed = refused
        assert templates == [] and "plan" not in prompts
        assert "Unknown resource template" in str(completed[0]) and "Unknown prompt" in str(completed[1])


async def test_a_listen_stream_hears_no_update_of_a_resource_its_caller_may_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: the SDK's handler honoured every URI a stream asked for, so the refused caller's stream heard the
    # downstream's update as soon as a caller with rights had it subscribed downstream.
    from kit.servers import everything_downstream

    auth = {
        "tokens": [
            {"env": "T1", "principal": "ev-user", "tools": ["ev.*"]},
            {"env": "T2", "principal": "other", "tools": ["echo"]},
        ]
    }
    secrets = {"T1": "ev-secret", "T2": "other-secret"}
    for k, v in secrets.items():
        monkeypatch.setenv(k, v)
    cfg = make_config(secrets, mcpServers={"ev": everything_downstream()}, auth=auth)
    uri = "test://watched-resource"
    overheard: list[Any] = []
    with trio.fail_after(30):
        async with (
            open_app(cfg) as app,
            http_server(app) as url,
            bearer_client(url, "other-secret", mode="2026-07-28") as other,
            other.listen(resource_subscriptions=[uri]) as eavesdrop,
            bearer_client(url, "ev-secret", mode="2026-07-28") as owner,
            owner.listen(resource_subscriptions=[uri]) as sub,
        ):
            await owner.call_tool("ev.test_update_watched_resource", {})
            heard = await anext(aiter(sub))
            with trio.move_on_after(1):
                overheard.append(await anext(aiter(eavesdrop)))
    assert getattr(heard, "uri", None) == uri and overheard == []
