"""The console's JSON API (``/api/v1``), the contract its pages are drawn from, over real HTTP (the server's own
front on 127.0.0.1) with runs submitted by the SDK's client: rights, filters and pages, a run's plan marked
(parallel branches, a playbook's arcs taken), its events streamed, cancel and retry, sessions and CSRF, the
front's checks, and nothing secret in what it answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
import trio

from kit.clients import bearer_client
from kit.run_tools import gate, release, reset_gate
from kit.servers import http_server, make_config, self_signed
from kit.tools import test_tools
from mcpipe.server import open_app

TOKENS = {"alice": "tok-alice-3c9e", "bob": "tok-bob-77aa", "root": "tok-root-e01b"}
PLAYBOOK = Path(__file__).resolve().parents[1] / "formats" / "noetl" / "golden" / "4.26.0" / "conditional_flow.yaml"


class Console:
    def __init__(self, base: str, http: httpx2.AsyncClient) -> None:
        self.base, self.http = base, http
        self.mcp = base + "/mcp"

    async def get(self, path: str, who: str | None = "alice", **kw: Any) -> httpx2.Response:
        headers = {"Authorization": f"Bearer {TOKENS[who]}"} if who else {}
        return await self.http.get(self.base + path, headers={**headers, **kw.pop("headers", {})}, **kw)

    async def call(self, who: str, tool: str, args: dict[str, Any]) -> Any:
        async with bearer_client(self.mcp, TOKENS[who]) as client:
            r = await client.call_tool(tool, args)
        return r.structured_content

    async def submit(self, who: str, spec: dict[str, Any]) -> str:
        answer = await self.call(who, "mcp_pipe", {"background": True, **spec})
        return str(answer["result"]["run_id"])

    async def done(self, who: str, run_id: str) -> None:
        await self.call(who, "pipe_result", {"run_id": run_id, "wait_ms": 20_000})


@asynccontextmanager
async def console(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, verify: Any = True, resource: str | None = None, **doc: Any
) -> AsyncIterator[Console]:
    for who, token in TOKENS.items():
        monkeypatch.setenv(f"TOKEN_{who.upper()}", token)
    doc.setdefault("console", {"enabled": True, "operators": ["root"]})
    config = make_config(
        environ=dict(__import__("os").environ),
        auth={
            "tokens": [{"env": f"TOKEN_{w.upper()}", "principal": w} for w in TOKENS],
            **({"resource": {"url": resource}} if resource else {}),
        },
        **doc,
    )
    reset_gate()
    async with (
        open_app(config, extra_sources=[gate, test_tools]) as app,
        http_server(app) as url,
        httpx2.AsyncClient(follow_redirects=False, verify=verify) as http,
    ):
        yield Console(url.rsplit("/mcp", 1)[0], http)


async def test_a_principal_sees_only_its_own_runs_and_an_operator_sees_every_ones(monkeypatch, tmp_path):
    with trio.fail_after(60):
        async with console(monkeypatch, tmp_path) as c:
            mine = await c.submit("alice", {"steps": [{"id": "a", "tool": "echo", "args": {"who": "alice"}}]})
            theirs = await c.submit("bob", {"steps": [{"id": "b", "tool": "echo", "args": {"who": "bob"}}]})
            await c.done("alice", mine)
            await c.done("bob", theirs)
            alice = (await c.get("/api/v1/runs", "alice")).json()
            asked = (await c.get("/api/v1/runs?principal=bob", "alice")).json()  # a filter does not widen it
            root = (await c.get("/api/v1/runs", "root")).json()
            only_bob = (await c.get("/api/v1/runs?principal=bob", "root")).json()
            hidden = await c.get(f"/api/v1/runs/{theirs}", "alice")
            cancel = await c.http.post(
                f"{c.base}/api/v1/runs/{theirs}/cancel", headers={"Authorization": f"Bearer {TOKENS['alice']}"}
            )
            anonymous = await c.get("/api/v1/runs", None)
    assert [r["run_id"] for r in alice["runs"]] == [mine] and alice["viewer"] == {
        "principal": "alice", "operator": False, "roles": []}  # fmt: skip
    assert [r["run_id"] for r in asked["runs"]] == [mine]
    assert [r["run_id"] for r in root["runs"]] == [theirs, mine] and root["viewer"]["operator"] is True
    assert [r["run_id"] for r in only_bob["runs"]] == [theirs]
    assert hidden.status_code == 404 and hidden.json() == {"error": "NOT_FOUND", "message": f"no run {theirs!r}"}
    assert cancel.status_code == 404
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Bearer")


async def test_the_runs_list_filters_pages_and_refuses_bad_filters_located(monkeypatch, tmp_path):
    with trio.fail_after(60):
        async with console(monkeypatch, tmp_path) as c:
            ids = [
                await c.submit("alice", {"steps": [{"id": "s", "tool": "echo", "args": {"i": i}}]}) for i in range(5)
            ]
            for run_id in ids:
                await c.done("alice", run_id)
            first = (await c.get("/api/v1/runs?limit=2")).json()
            second = (await c.get(f"/api/v1/runs?limit=2&before={first['next']}")).json()
            completed = (await c.get("/api/v1/runs?status=completed&tool=mcp_pipe&since=1h")).json()
            none = (await c.get("/api/v1/runs?tool=report")).json()
            future = (await c.get("/api/v1/runs?since=2999-01-01T00:00")).json()
            bad = [
                (await c.get(q)).json()
                for q in ("/api/v1/runs?status=done", "/api/v1/runs?since=yesterday", "/api/v1/runs?limit=0")
            ]
    assert [r["run_id"] for r in first["runs"]] == ids[::-1][:2]
    assert [r["run_id"] for r in second["runs"]] == ids[::-1][2:4]
    assert [r["run_id"] for r in completed["runs"]] == ids[::-1]
    assert none["runs"] == [] and future["runs"] == []
    assert [b["message"].split(":")[0] for b in bad] == ["status", "since", "limit"]
    assert all(b["error"] == "INVALID_ARGUMENTS" for b in bad)


async def test_a_run_answers_its_plan_marked_its_steps_timeline_and_located_errors(monkeypatch, tmp_path):
    spec = {
        "steps": [
            {"id": "start", "tool": "echo", "args": {"n": 1}},
            {"id": "fan", "parallel": [
                {"id": "good", "tool": "echo", "args": {"n": "${steps.start.output.n}"}},
                {"id": "bad", "tool": "fail", "args": {}},
            ]},
            {"id": "never", "tool": "echo", "args": {}},
        ]
    }  # fmt: skip
    with trio.fail_after(60):
        async with console(monkeypatch, tmp_path) as c:
            run_id = await c.submit("alice", spec)
            await c.done("alice", run_id)
            data = (await c.get(f"/api/v1/runs/{run_id}")).json()
    assert data["run"]["status"] == "failed" and data["can_retry"] and not data["can_cancel"]
    assert data["plan"]["states"] == {"start": "ok", "fan.good": "ok", "fan.bad": "failed"}
    assert "s0 --> s1" in data["plan"]["mermaid"] and 'subgraph c0["fan (parallel)"]' in data["plan"]["mermaid"]
    assert 'data-key="fan.bad"' in data["plan"]["svg"] and "state-failed" in data["plan"]["svg"]
    steps = {s["path"]: s for s in data["steps"]}
    assert set(steps) == {"start", "fan.good", "fan.bad"}
    assert steps["fan.good"]["args"] == {"n": 1} and steps["fan.good"]["output"] == {"n": 1}
    assert steps["fan.good"]["output_bytes"] > 0 and steps["fan.bad"]["location"] == "steps[1].parallel[1]"
    assert data["errors"][0] == {
        "path": "fan.bad", "anchor": "step-fan.bad", "location": "steps[1].parallel[1]", "code": "TOOL_ERROR",
        "message": "it did not work"}  # fmt: skip
    bars = {b["path"]: b for b in data["timeline"]["steps"]}
    assert set(bars) == set(steps) and all(b["length_ms"] >= 0 for b in bars.values())
    assert data["timeline"]["queued"] and data["timeline"]["total_ms"] > 0
    assert data["events"][0]["type"] == "enqueued" and data["events"][-1]["type"] == "failed"


async def test_a_playbook_runs_arcs_taken_are_marked(monkeypatch, tmp_path):
    doc = {
        "outbound": {"commands": {"sh": "/bin/sh"}},
        "playbooks": [{"files": str(PLAYBOOK), "background": True}],
        "console": {"enabled": True, "operators": ["root"]},
    }
    with trio.fail_after(60):
        async with console(monkeypatch, tmp_path, **doc) as c:
            started = await c.call("alice", "conditional_flow_example", {})
            run_id = started["run_id"]
            await c.done("alice", run_id)
            data = (await c.get(f"/api/v1/runs/{run_id}")).json()
    states = data["plan"]["states"]
    assert states["start"] == "ok" and states["prod_setup"] == "ok" and states["deploy_app"] == "ok"
    assert "staging_setup" not in states and "skip_deploy" not in states  # the arcs not taken: never run
    taken = set(data["plan"]["taken"])
    assert "workflow[0].next.arcs[0]" in taken and "workflow[0].next.arcs[1]" not in taken
    assert "workflow[4].next.arcs[0]" in taken and "workflow[4].next.arcs[1]" not in taken


async def test_a_runs_events_stream_as_they_are_written_and_end_with_the_run(monkeypatch, tmp_path):
    spec = {"steps": [{"id": "a", "tool": "echo", "args": {}}, {"id": "b", "tool": "wait_for", "args": {"tag": "go"}}]}
    with trio.fail_after(60):
        async with console(monkeypatch, tmp_path) as c:
            run_id = await c.submit("alice", spec)
            seen: list[dict[str, Any]] = []
            headers = {"Authorization": f"Bearer {TOKENS['alice']}"}
            async with c.http.stream("GET", f"{c.base}/api/v1/streams/runs/{run_id}", headers=headers) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                kind = None
                async for line in r.aiter_lines():
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: ") and kind == "run-event":
                        seen.append(orjson.loads(line[6:]))
                        if seen[-1]["type"] == "step_started" and seen[-1]["path"] == "b":
                            release("go")  # written after the stream had it: it comes live
                    elif line.startswith("data: ") and kind == "end":
                        seen.append({"type": "end"})  # then the server closes the stream
            other = await c.get(f"/api/v1/streams/runs/{run_id}", "bob")
    assert [(e["type"], e.get("path")) for e in seen][-4:] == [("step_started", "b"), ("step_finished", "b"),
                                                              ("completed", None), ("end", None)]  # fmt: skip
    assert other.status_code == 404


async def test_cancel_and_retry_act_as_the_pipe_tools_and_retry_runs_as_the_caller(monkeypatch, tmp_path):
    with trio.fail_after(60):
        async with console(monkeypatch, tmp_path) as c:
            run_id = await c.submit("alice", {"steps": [{"id": "w", "tool": "wait_for", "args": {"tag": "never"}}]})
            headers = {"Authorization": f"Bearer {TOKENS['alice']}"}
            cancelled = await c.http.post(f"{c.base}/api/v1/runs/{run_id}/cancel", headers=headers)
            await c.done("alice", run_id)
            again = await c.http.post(f"{c.base}/api/v1/runs/{run_id}/cancel", headers=headers)
            retried = await c.http.post(
                f"{c.base}/api/v1/runs/{run_id}/retry", headers={"Authorization": f"Bearer {TOKENS['root']}"}
            )
            new = retried.json()["run"]["run_id"]
            status = await c.call("root", "pipe_status", {"run_id": new})
            release("never")
            await c.done("root", new)
            final = await c.call("alice", "pipe_status", {"run_id": run_id})
    assert cancelled.status_code == 200 and final["status"] == "cancelled"
    assert again.status_code == 409 and again.json()["error"] == "CONFLICT"
    assert retried.status_code == 200 and retried.json()["retry_of"] == run_id
    assert status["principal"] == "root"  # the operator's retry is the operator's run


async def test_a_browser_signs_in_with_a_token_and_its_forms_need_the_sessions_csrf_token(monkeypatch, tmp_path):
    with trio.fail_after(60):
        async with console(monkeypatch, tmp_path) as c:
            run_id = await c.submit("alice", {"steps": [{"id": "w", "tool": "wait_for", "args": {"tag": "t"}}]})
            page = await c.http.get(f"{c.base}/console/runs")  # no credential: to the sign-in page
            login = await c.http.get(f"{c.base}/console/login")
            csrf = _csrf(login.text)
            bad = await c.http.post(f"{c.base}/console/login", data={"token": "wrong", "csrf": csrf})
            forged = await c.http.post(f"{c.base}/console/login", data={"token": TOKENS["alice"], "csrf": "x" * 32})
            good = await c.http.post(f"{c.base}/console/login", data={"token": TOKENS["alice"], "csrf": csrf})
            cookie = good.headers["set-cookie"]
            runs = await c.http.get(f"{c.base}/console/runs")
            run_page = await c.http.get(f"{c.base}/console/runs/{run_id}")
            no_token = await c.http.post(f"{c.base}/console/runs/{run_id}/cancel", data={})
            api_no_token = await c.http.post(f"{c.base}/api/v1/runs/{run_id}/cancel")
            cancelled = await c.http.post(f"{c.base}/console/runs/{run_id}/cancel", data={"csrf": _csrf(run_page.text)})
            c.http.cookies.clear()
            c.http.cookies.set("mcpipe_console", cookie.split(";")[0].split("=", 1)[1][:-4] + "AAAA")
            tampered = await c.http.get(f"{c.base}/console/runs")
            release("t")
    assert page.status_code == 303 and page.headers["location"] == "/console/login?next=/console/runs"
    assert bad.status_code == 401 and "does not verify" in bad.text
    assert forged.status_code == 403
    assert good.status_code == 303 and good.headers["location"] == "/console/runs"
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKENS["alice"] not in cookie
    assert runs.status_code == 200 and run_id in runs.text
    assert no_token.status_code == 403 and api_no_token.status_code == 403
    assert cancelled.status_code == 303 and cancelled.headers["location"] == f"/console/runs/{run_id}"
    assert tampered.status_code == 303  # a cookie that does not verify signs nobody in


async def test_the_session_cookie_is_secure_over_https_and_behind_an_https_proxy(monkeypatch, tmp_path):
    import ssl

    cert, key = await self_signed(tmp_path)
    tls = {"tls": {"cert_file": str(cert), "key_file": str(key)}}
    proxied = {"X-Forwarded-Proto": "https"}

    async def cookies(c: Console, headers: dict[str, str] | None = None) -> tuple[str, str]:
        """The cookie of a first visit, and the signed-in one of a sign-in (both with ``headers``)."""
        c.http.cookies.clear()
        login = await c.http.get(f"{c.base}/console/login", headers=headers)
        c.http.cookies.clear()  # sent back by hand: a Secure cookie is not, over the plain HTTP behind a proxy
        form = {"token": TOKENS["alice"], "csrf": _csrf(login.text)}
        back = {**(headers or {}), "Cookie": login.headers["set-cookie"].split(";", 1)[0]}
        signed = await c.http.post(f"{c.base}/console/login", data=form, headers=back)
        assert signed.status_code == 303
        return login.headers["set-cookie"], signed.headers["set-cookie"]

    with trio.fail_after(60):
        async with console(monkeypatch, tmp_path, verify=ssl.create_default_context(cafile=str(cert)), http=tls) as c:
            assert c.base.startswith("https://")
            over_tls = await cookies(c)
        async with console(monkeypatch, tmp_path) as c:
            plain = await cookies(c)
            behind_proxy = await cookies(c, proxied)
        front = {"allowed_hosts": ["127.0.0.1:*"], "allowed_origins": ["https://mcp.example.com"]}
        async with console(monkeypatch, tmp_path, http=front) as c:
            https_page = await cookies(c, {"Origin": "https://mcp.example.com"})
        async with console(monkeypatch, tmp_path, resource="https://mcp.example.com/mcp") as c:
            public_https = await cookies(c)
        on = {"enabled": True, "operators": ["root"], "secure_cookies": True}
        async with console(monkeypatch, tmp_path, console=on) as c:
            always = await cookies(c)
        off = {"enabled": True, "operators": ["root"], "secure_cookies": False}
        async with console(monkeypatch, tmp_path, console=off) as c:
            never_by_header = await cookies(c, proxied)

    def flags(cookie: str) -> set[str]:
        return {p.strip() for p in cookie.split(";")[1:] if not p.strip().startswith(("Path=", "Max-Age="))}

    for pair in (over_tls, behind_proxy, https_page, public_https, always):
        assert [flags(c) for c in pair] == [{"HttpOnly", "SameSite=Strict", "Secure"}] * 2
    for pair in (plain, never_by_header):
        assert [flags(c) for c in pair] == [{"HttpOnly", "SameSite=Strict"}] * 2


async def test_the_console_keeps_the_fronts_host_checks_its_csp_and_no_secret_in_a_page(monkeypatch, tmp_path):
    monkeypatch.setenv("MCPIPE_STATE_KEY", "state-key-never-shown-0b3d-5f1e9a7c2d4b6e8f0a1c3e5")
    with trio.fail_after(60):
        async with console(monkeypatch, tmp_path) as c:
            run_id = await c.submit("alice", {"steps": [{"id": "s", "tool": "echo", "args": {}}]})
            await c.done("alice", run_id)
            rebinding = await c.get("/api/v1/runs", headers={"Host": "evil.example:80"})
            origin = await c.get("/console/runs", headers={"Origin": "http://evil.example"})
            pages = [await c.get(p, "root") for p in ("/console/runs", f"/console/runs/{run_id}",
                                                       "/console/servers", "/console/metrics")]  # fmt: skip
            apis = [await c.get(p, "root") for p in ("/api/v1/runs", f"/api/v1/runs/{run_id}", "/api/v1/servers",
                                                      "/api/v1/metrics", "/api/v1")]  # fmt: skip
            static = await c.get("/console/static/console.js", None)
            escape = await c.get("/console/static/..%2F_app.py", None)
    assert rebinding.status_code == 421 and origin.status_code == 421
    for r in pages + apis:
        assert r.status_code == 200, r.text
        csp = r.headers["content-security-policy"]
        assert "unsafe-inline" not in csp and "default-src 'none'" in csp and "script-src 'self'" in csp
        for secret in [*TOKENS.values(), "state-key-never-shown-0b3d-5f1e9a7c2d4b6e8f0a1c3e5"]:
            assert secret not in r.text
    assert all("<script>" not in r.text for r in pages)  # scripts only from the console's own file
    assert static.status_code == 200 and static.headers["content-type"].startswith("text/javascript")
    assert escape.status_code == 404


async def test_metrics_and_servers_read_what_metrics_counts(monkeypatch, tmp_path):
    with trio.fail_after(60):
        async with console(monkeypatch, tmp_path) as c:
            await c.call("alice", "echo", {"x": 1})
            await c.call("bob", "fail", {})
            root = (await c.get("/api/v1/metrics", "root")).json()
            bob = (await c.get("/api/v1/metrics", "bob")).json()
            servers = (await c.get("/api/v1/servers", "alice")).json()
            scraped = (await c.get("/metrics", "root")).text
    by_principal = {p["principal"]: p for p in root["principals"]}
    assert by_principal["alice"]["calls"] >= 1 and by_principal["bob"]["errors"] >= 1
    assert [p["principal"] for p in bob["principals"]] == ["bob"]  # the others' rows are an operator's to see
    assert root["errors_by_code"].get("UNKNOWN", 0) >= 1 or root["errors_by_code"]
    assert {t["tool"] for t in root["tools"]} >= {"echo", "fail"}
    assert 'mcpipe_principal_calls_total{outcome="ok",principal="alice"}' in scraped
    assert {t["name"] for t in servers["tools"]} >= {"echo", "mcp_pipe", "pipe_status"}


async def test_the_console_is_off_unless_asked(monkeypatch, tmp_path):
    with trio.fail_after(30):
        async with console(monkeypatch, tmp_path, console={"enabled": False}) as c:
            page = await c.get("/console/runs")
            api = await c.get("/api/v1/runs")
    assert page.status_code == 404 and api.status_code == 404


def _csrf(html: str) -> str:
    marker = 'name="csrf" value="'
    return html.split(marker, 1)[1].split('"', 1)[0]
