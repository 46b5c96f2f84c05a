"""``mcpipe auth login|list|revoke``, as an operator runs them: the operator signs in to a downstream server's
own authorization server (the shared account every caller's calls use), sees the sign-in listed, and revokes it;
the server's calls carry the operator's token (asserted on the downstream's side)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx2
import pytest
import trio

from kit.authserver import auth_server
from kit.oauth_downstream import recording_server
from kit.realservers import free_port
from mcpipe.config import load_config
from mcpipe.server import open_app
from mcpipe.tools import ToolContext

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

KEY = "an-operator-key-of-more-than-32-characters"


async def _mcpipe(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    done = await trio.run_process(
        [sys.executable, "-m", "mcpipe", *args], capture_stdout=True, capture_stderr=True, check=False, env=env
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_the_operator_signs_in_lists_and_revokes_the_shared_account(tmp_path: Path):
    async with auth_server(opaque=True, default_user="ops-at-down") as down_as, recording_server() as down:

        async def verify(token: str) -> dict[str, str] | None:
            found = down_as.tokens.get(token)
            return None if found is None or found.resource != down.url else {"sub": found.user}

        down.verify, down.protect = verify, None  # every request needs a token
        down.metadata = {"resource": down.url, "authorization_servers": [down_as.url]}
        port = free_port()
        config = tmp_path / "mcpipe.toml"
        config.write_text(
            f"""
audit = {{ enabled = false }}
[oauth]
store = "sqlite:///tokens.db"
callback_url = "http://127.0.0.1:{port}/oauth/callback"
[mcpServers.down]
url = "{down.url}"
oauth = {{ allow_private = true }}
"""
        )
        env = {**os.environ, "MCPIPE_OAUTH_KEY": KEY}
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "mcpipe", "auth", "login", "down", "--config", str(config), "--timeout", "60"],
            stdout=-1,
            stderr=-1,
            env=env,
        )
        assert proc.stdout is not None
        printed = b""
        with trio.fail_after(60):
            while b"/authorize?" not in printed or not printed.endswith(b"\n"):
                chunk = await proc.stdout.receive_some()
                assert chunk, printed
                printed += chunk
            url = next(line for line in printed.decode().splitlines() if "/authorize?" in line)
            async with httpx2.AsyncClient(follow_redirects=False) as browser:
                approved = await browser.get(url)
                # The command listens on the callback's loopback port before it prints the URL.
                landed = await browser.get(approved.headers["location"])
            while chunk := await proc.stdout.receive_some():
                printed += chunk
            await proc.wait()
        assert proc.returncode == 0 and landed.status_code == 200, printed
        code, listed, _ = await _mcpipe("auth", "list", "--config", str(config), "--json", env=env)
        rows = [json.loads(line) for line in listed.splitlines()]
        assert code == 0 and [(r["server"], r["principal"]) for r in rows] == [("down", "_operator")]
        os.environ["MCPIPE_OAUTH_KEY"] = KEY
        try:
            async with open_app(load_config(str(config))) as app:
                tool = app.gateway.get("down.whoami")
                assert tool is not None
                result = await app.gateway.call("down.whoami", {}, ToolContext())
        finally:
            del os.environ["MCPIPE_OAUTH_KEY"]
        assert result.content[0]["text"] == "ops-at-down"
        # Past the sign-in's discovery probe, every request (the listing, the call) carried the operator's token.
        assert all(seen["authorization"] for seen in down.seen if seen.get("method") != "ping")
        code, out, _ = await _mcpipe("auth", "revoke", "down", "--config", str(config), env=env)
        assert code == 0 and "revoked" in out
        code, listed, _ = await _mcpipe("auth", "list", "--config", str(config), env=env)
        assert code == 0 and listed == ""
        code, _, err = await _mcpipe("auth", "revoke", "nowhere", "--config", str(config), env=env)
        assert code == 2 and "no server `nowhere` with `oauth`" in err and "Traceback" not in err
        code, _, err = await _mcpipe("auth", "list", "--config", str(config), env={**env, "MCPIPE_OAUTH_KEY": ""})
        assert code == 2 and "MCPIPE_OAUTH_KEY" in err and "Traceback" not in err
