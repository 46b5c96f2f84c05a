"""The tests' authorization server (``kit.authserver``, built on Authlib) passes the official conformance
suite's authorization-server scenarios: it is a real one. The suite's callback listens on a free port; the
test plays the browser it asks a person to use (opens the printed URL, follows the redirect to the callback)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import trio

from conformance.harness import suite
from kit.authserver import auth_server
from kit.realservers import free_port


async def test_the_test_authorization_server_passes_the_suites_authorization_server_scenarios(tmp_path: Path):
    async with auth_server() as server:
        port = free_port()
        server.register("conformance", redirect_uris=[f"http://127.0.0.1:{port}/callback"], auth_method="none")
        args = [*suite(), "authorization", "--url", server.url, "--client-id", "conformance", "-p", str(port)]
        proc = await trio.lowlevel.open_process([*args, "-o", str(tmp_path)], stdout=-1, stderr=-1)
        assert proc.stdout is not None
        printed = b""
        with trio.fail_after(120):
            # The suite prints the URL, then starts its callback server and says so.
            while b"Callback server started" not in printed:
                chunk = await proc.stdout.receive_some()
                assert chunk, printed.decode(errors="replace")
                printed += chunk
            url = next(line for line in printed.decode().splitlines() if "/authorize?" in line).strip()
            async with httpx2.AsyncClient(follow_redirects=False) as browser:
                approved = await browser.get(url)
                assert approved.status_code == 302
                await browser.get(approved.headers["location"])
            while chunk := await proc.stdout.receive_some():
                printed += chunk
            await proc.wait()
    checks = [c for f in await trio.Path(tmp_path).rglob("checks.json") for c in json.loads(await f.read_text())]
    assert {c["id"] for c in checks} >= {"authorization-server-metadata", "authorization-code-grant"}, printed
    assert all(c["status"] == "SUCCESS" for c in checks), [c for c in checks if c["status"] != "SUCCESS"]
    assert proc.returncode == 0
