"""A hostile downstream server behind a real ``mcpipe serve`` over HTTP (issue 20, items 10 and 11): a list of
3000 tools is cut to ``max_tools`` in one log line, the metrics keep a bounded set of tool labels, and a flood
of log messages with newlines and forged lines reaches mcpipe's log escaped, cut and rate-limited."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx2
import pytest
import trio

from kit.servers import start_process
from kit.siege import base_of, call, probing, rpc, rss_mb, serve_process

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

FLOOD = str(Path(__file__).with_name("flood_downstream.py"))


def config(tools: int, **extra: str) -> str:
    lines = "".join(f"{k} = {v}\n" for k, v in extra.items())
    return f"""
builtins = ["echo"]
[audit]
enabled = false
[telemetry]
max_tool_labels = 20
[mcpServers.flood]
command = {json.dumps(sys.executable)}
args = [{json.dumps(FLOOD)}]
env = {{ FLOOD_TOOLS = "{tools}" }}
connect_timeout_ms = 60000
{lines}"""


async def list_tools(http: httpx2.AsyncClient, url: str) -> list[str]:
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/list",
        "params": {"_meta": call("x", {})["params"]["_meta"]},
    }
    status, answer = await rpc(http, url, message, "tools/list")
    assert status == 200, answer
    return [t["name"] for t in answer["result"]["tools"]]


async def test_a_hostile_downstream_cannot_bloat_the_server_its_metrics_or_its_log(tmp_path: Path) -> None:
    # Before: 100 000 tools cost 1.1 GB and 3.7 s per tools/list; /metrics grew 21 series per distinct tool;
    # log messages went into mcpipe's log verbatim at the level the downstream chose, newlines included:
    # 57 MB in 10 s, and lines that looked like mcpipe's own.
    rss: list[float] = []
    with trio.fail_after(120):
        async with serve_process(config(3000), tmp_path) as served, httpx2.AsyncClient(timeout=60) as http:
            async with probing(served.url):
                for _ in range(6):
                    names = await list_tools(http, served.url)
                    rss.append(rss_mb(served.proc.pid))
                for i in range(40):  # 40 distinct tools called: at most 20 of them become labels
                    status, answer = await rpc(http, served.url, call(f"flood.t{i}", {}, rid=i), f"flood.t{i}")
                    assert status == 200 and answer["result"]["content"][0]["text"] == "ok"
                metrics = (await http.get(base_of(served.url) + "/metrics")).text
                before = len(served.text())
                args = {"count": 1000, "size": 10_000}  # 10 MB of log messages
                status, answer = await rpc(http, served.url, call("flood.shout", args), "flood.shout")
                args = {"count": 1000, "size": 100}  # short ones, their forged lines within what is kept
                await rpc(http, served.url, call("flood.shout", args), "flood.shout")
                await trio.sleep(0.5)
            status_after, alive = await rpc(http, served.url, call("echo", {"alive": True}), "echo")
            text = served.text()
    # 10. the tools, cut in one log line; the metrics' labels, bounded; the memory, flat.
    flood = [n for n in names if n.startswith("flood.")]
    assert len(flood) == 1000 and "flood.shout" in flood and "flood.t998" in flood and "flood.t999" not in flood
    said = [line for line in text.splitlines() if "lists more than" in line]
    assert len(said) == 1 and "downstream flood lists more than 1000 tools: keeping the first 1000" in said[0]
    assert "(mcpServers.flood.max_tools)" in said[0]
    labels = set(re.findall(r'mcpipe_calls_total\{[^}]*tool="([^"]+)"', metrics))
    assert len(labels) <= 21 and "other" in labels, sorted(labels)
    print("RSS (MB) after each tools/list:", [round(r) for r in rss])
    assert rss[-1] - rss[1] < 10, rss
    # 11. the log: escaped, cut, at WARNING at most, rate-limited; the server alive.
    log = text[before:]
    assert status == 200 and answer["result"]["content"][0]["text"] == "ok"
    assert status_after == 200 and alive["result"]["structuredContent"] == {"alive": True}
    lines = log.splitlines()
    assert len(log) < 512 * 1024, len(log)
    assert not [line for line in lines if line.startswith("2030-01-01")]  # nothing forged a line of its own
    shouted = [line for line in lines if "log message of evil" in line]
    assert shouted and all(line.split(" ", 3)[2] == "WARNING" for line in shouted)  # not the "emergency" sent
    assert all(len(line) < 2400 for line in shouted)  # cut
    assert any(line.endswith("... (10074 characters)") for line in shouted)
    assert any("\\n2030-01-01 00:00:00,000 CRITICAL mcpipe.server: FORGED" in line for line in shouted)  # escaped
    assert any("downstream flood: dropped" in line and "log messages (more than 50 a second)" in line for line in lines)


# --- issue 27, item 11: one listing of 100 000 tools over HTTP ---------------------------------------------------

WIDE = str(Path(__file__).with_name("wide_downstream.py"))


def _peak_mb(pid: int) -> float:
    """The high-water mark of process ``pid``'s resident memory, in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for {pid}")


async def test_a_downstream_listing_100_000_tools_is_cut_while_it_is_read(tmp_path: Path) -> None:
    # Before: the whole listing (100 000 tools, 16.6 MB) was read and validated before `max_tools` (1000) cut
    # it: the server's peak resident memory went from 109 to 746 MB (the issue saw 1.46 GB), the call waited
    # 32 s and /healthz went unanswered 10 s. Now it is cut to 4000 as it streams: 139 MB, /healthz < 1 s.
    proc, url = await start_process([sys.executable, WIDE, "0"], marker="", stream="stdout")
    try:
        server = f'url = "{url}"\nconnect = "lazy"\nconnect_timeout_ms = 90000\n'
        toml = f"[audit]\nenabled = false\n\n[mcpServers.wide]\n{server}"
        with trio.fail_after(120):
            async with serve_process(toml, tmp_path) as served, httpx2.AsyncClient(timeout=100) as http:
                before = _peak_mb(served.proc.pid)
                async with probing(served.url):
                    status, answer = await rpc(http, served.url, call("wide.t5", {}), "wide.t5")
                    names = await list_tools(http, served.url)
                peak = _peak_mb(served.proc.pid)
                text = served.text()
    finally:
        proc.kill()
        await proc.wait()
    assert status == 200 and answer["result"]["content"][0]["text"] == "t5 ok", (answer, text[-2000:])
    wide = [n for n in names if n.startswith("wide.")]
    assert len(wide) == 1000 and "wide.t999" in wide and "wide.t1000" not in wide
    assert "downstream wide lists more than 1000 tools: keeping the first 1000" in text
    print(f"peak RSS {before:.0f} MB before the listing, {peak:.0f} MB after")
    assert peak - before < 150, (before, peak)
