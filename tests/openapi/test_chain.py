"""A three-step ``mcp_pipe`` chain over GitHub's REST description: a reshaped ``repos/get`` (the owner fixed,
the answer projected to the default branch), then ``repos/get-branch`` on that branch, then
``issues/create`` titled with the branch's head commit. Every request reaches the stand-in, which checks it
against GitHub's document."""

from __future__ import annotations

from typing import Any

import trio

from kit.clients import bearer_client
from kit.openapi_standin import DOCUMENTS, read, standin
from kit.servers import http_server, make_config
from mcpipe.server import open_app

RESPONSES = {
    "repos/get": {"full_name": "octo-org/hello", "default_branch": "trunk", "private": False},
    "repos/get-branch": {"name": "trunk", "commit": {"sha": "6dcb09b5b57875f334f61aebed695e2e4193db5e"}},
}


async def test_three_github_operations_one_reshaped_chain_in_one_mcp_pipe_call() -> None:
    config_for: Any = lambda url: make_config(  # noqa: E731
        openapi={
            "github": {"spec": str(DOCUMENTS / "github-api.github.com.json.gz"), "base_url": url, "validate": False}
        },
        tools={
            "discovery": "search",
            "reshape": {
                "default_branch": {
                    "tool": "github.repos_get",
                    "description": "The default branch of one of octo-org's repositories.",
                    "arguments": {"owner": {"value": "octo-org"}, "repo": {"name": "repository"}},
                    "output": "last.default_branch",
                }
            },
        },
    )
    pipeline = {
        "steps": [
            {"id": "branch", "tool": "default_branch", "args": {"repository": "hello"}},
            {
                "id": "head",
                "tool": "github.repos_get-branch",
                "args": {"owner": "octo-org", "repo": "hello", "branch": "${steps.branch.output}"},
            },
            {
                "id": "issue",
                "tool": "github.issues_create",
                "args": {
                    "owner": "octo-org",
                    "repo": "hello",
                    "body": {"title": "Review ${steps.head.structured.commit.sha}", "labels": ["review"]},
                },
            },
        ],
        "return": {"issue": "${steps.issue.structured.body}", "branch": "${steps.branch.output}"},
    }
    with trio.fail_after(120):
        async with (
            standin(read("github-api.github.com.json.gz"), responses=RESPONSES) as api,
            open_app(config_for(api.url)) as app,
            http_server(app) as url,
            bearer_client(url, None) as client,
        ):
            found = await client.call_tool("search_tools", {"query": "create an issue in a repository"})
            answer = (await client.call_tool("mcp_pipe", pipeline)).structured_content or {}
    assert "github.issues_create" in [t["name"] for t in (found.structured_content or {})["tools"]][:3]
    assert answer.get("ok") is True, answer
    result = answer["result"]
    assert result["branch"] == "trunk"
    assert result["issue"] == {"title": "Review 6dcb09b5b57875f334f61aebed695e2e4193db5e", "labels": ["review"]}
    assert [(s.operation, s.path) for s in api.seen] == [
        ("repos/get", "/repos/octo-org/hello"),
        ("repos/get-branch", "/repos/octo-org/hello/branches/trunk"),
        ("issues/create", "/repos/octo-org/hello/issues"),
    ]
    assert not api.invalid
