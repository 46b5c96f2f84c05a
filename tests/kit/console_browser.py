"""The console under a real browser: a real ``mcpipe serve --console`` (a subprocess on a free port of 127.0.0.1,
the tools of ``console_tools``), Debian's Chromium driven by Selenium through Debian's chromedriver (nothing
downloads a browser or a driver), and an MCP client (the SDK's, over streamable HTTP) submitting the runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from kit.clients import bearer_client

HERE = Path(__file__).parent
CHROMIUM = os.environ.get("MCPIPE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MCPIPE_CHROMEDRIVER", "/usr/bin/chromedriver")
WAIT_S = 60
TOKENS = {"alice": "alice-token-1f7c", "bob": "bob-token-90d2", "root": "root-token-5b1e"}


def have_browser() -> bool:
    return os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)


class Served:
    """A running ``mcpipe serve``: its base URL (``http://127.0.0.1:PORT``), its MCP URL and its log."""

    def __init__(self, proc: subprocess.Popen[bytes], base: str, log: list[str]) -> None:
        self.proc, self.base, self.log = proc, base, log
        self.mcp = base + "/mcp"

    def text(self) -> str:
        return "".join(self.log)

    def call(self, who: str, tool: str, args: dict[str, Any]) -> Any:
        """Call ``tool`` as ``who`` (its bearer token) and answer the structured content (or the text)."""

        async def go() -> Any:
            with trio.fail_after(WAIT_S):
                async with bearer_client(self.mcp, TOKENS[who]) as client:
                    r = await client.call_tool(tool, args)
            if r.structured_content is not None:
                return r.structured_content
            return r.content[0].text  # type: ignore[union-attr]

        return trio.run(go)

    def submit(self, who: str, spec: dict[str, Any]) -> str:
        """Queue ``spec`` as a background run of ``who``: its run id."""
        answer = self.call(who, "mcp_pipe", {"background": True, **spec})
        assert answer["ok"], answer
        return str(answer["result"]["run_id"])

    def wait(self, who: str, run_id: str) -> Any:
        """The run's status once it is done (``pipe_result`` waiting)."""
        self.call(who, "pipe_result", {"run_id": run_id, "wait_ms": 30_000})
        return self.call(who, "pipe_status", {"run_id": run_id})

    def until_event(self, who: str, run_id: str, type_: str, path: str | None = None) -> dict[str, Any]:
        """Follow the run's events (``pipe_events`` waiting for each) until one of ``type_`` (at ``path``)."""
        after = None
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            page = self.call(who, "pipe_events", {"run_id": run_id, "after": after, "wait_ms": 5000})
            for e in page["events"]:
                if e["type"] == type_ and (path is None or e.get("path") == path):
                    return dict(e)
            after = page["next"]
        raise AssertionError(f"no {type_} event at {path} in run {run_id}")


@contextmanager
def serving(tmp: Path, **extra: Any) -> Iterator[Served]:
    """``mcpipe serve --console`` with three token principals (``root`` an operator) and the test tools."""
    config = {
        "name": "demo",
        "audit": {"enabled": False},
        "python_tools": ["console_tools:tools"],
        "auth": {"tokens": [{"env": f"TOKEN_{p.upper()}", "principal": p} for p in TOKENS]},
        "console": {"operators": ["root"]},
        **extra,
    }
    path = tmp / "mcpipe.json"
    path.write_text(json.dumps(config))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        **{f"TOKEN_{p.upper()}": t for p, t in TOKENS.items()},
    }
    args = [sys.executable, "-m", "mcpipe", "serve", "--config", str(path), "--http", "127.0.0.1:0", "--console"]
    proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp)
    log: list[str] = []
    ready = threading.Event()
    base: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace")
            log.append(line)
            if "serving MCP at " in line and not base:
                base.append(line.split("serving MCP at ", 1)[1].split()[0].rsplit("/mcp", 1)[0])
                ready.set()
        ready.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert ready.wait(WAIT_S), "mcpipe serve did not start"
        assert base, "".join(log)
        yield Served(proc, base[0], log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(WAIT_S)
        reader.join(WAIT_S)
        if proc.stderr is not None:
            proc.stderr.close()


@contextmanager
def browser(width: int = 1280, height: int = 1000) -> Iterator[Any]:
    """Headless Chromium under Selenium, through the system's chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--force-device-scale-factor=1", "--hide-scrollbars"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=subprocess.DEVNULL)
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def sign_in(driver: Any, base: str, who: str) -> None:
    """Sign in on the console's form, as a person would: the token typed in, the button pressed."""
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(base + "/console/login")
    field = driver.find_element(By.ID, "token")
    field.send_keys(TOKENS[who])
    click(driver, By.CSS_SELECTOR, "form.signin button[type=submit]")
    wait_for(driver, lambda d: d.current_url.endswith("/console/runs"))


def wait_for(driver: Any, condition: Any, timeout: float = WAIT_S) -> Any:
    """``condition(driver)`` once it holds, within ``timeout`` (a page reloading under it is looked at again)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    ignored = (StaleElementReferenceException, NoSuchElementException)
    return WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=ignored).until(condition)


def click(driver: Any, by: str, what: str, timeout: float = WAIT_S) -> None:
    """Click the element ``what`` once it is there. A page redrawing itself between the look-up and the click
    (a live run page replaces its nodes on each event) is looked up again, not reported as a failure."""
    from selenium.common.exceptions import WebDriverException

    def clicked(d: Any) -> bool:
        try:
            d.find_element(by, what).click()
        except WebDriverException as e:
            if "does not belong to the document" in str(e.msg or ""):
                return False  # Chrome's word for a node replaced under the click
            raise
        return True

    wait_for(driver, clicked, timeout)


def save_shot(driver: Any, name: str, into: Path) -> Path:
    """A PNG of the page (its whole height), in ``into``; copied to ``$MCPIPE_CONSOLE_SHOTS`` when set
    (``make console-screenshots`` refreshes docs/console/)."""
    height = driver.execute_script("return Math.min(document.documentElement.scrollHeight, 4000)")
    width = driver.execute_script("return window.innerWidth")
    driver.set_window_size(width, int(height) + 40)
    out = into / f"{name}.png"
    driver.save_screenshot(str(out))
    dest = os.environ.get("MCPIPE_CONSOLE_SHOTS")
    if dest:
        Path(dest).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, Path(dest) / out.name)
    return out


def csp_violations(driver: Any) -> list[str]:
    """What the browser's console said of the Content-Security-Policy (nothing, on a page that keeps it)."""
    return [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e.get("message", "")]
