"""The console in a real browser (Debian's headless Chromium, driven by Selenium) against a real ``mcpipe serve
--console``, with the runs submitted by a real MCP client: what a person would see."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kit.console_browser import (
    Served,
    browser,
    click,
    csp_violations,
    have_browser,
    save_shot,
    serving,
    sign_in,
    wait_for,
)

pytestmark = pytest.mark.skipif(not have_browser(), reason="needs Debian's chromium and chromium-driver")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("console")) as served:
        yield served


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with browser() as d:
        yield d


def _by() -> Any:
    from selenium.webdriver.common.by import By

    return By


def _shape_class(driver: Any, key: str) -> str:
    return str(driver.execute_script(
        "const g = [...document.querySelectorAll('#graph g.shape')]"
        ".find(g => g.getAttribute('data-key') === arguments[0]);"
        "return g ? g.getAttribute('class') : '';",
        key,
    ))  # fmt: skip


def _rows(driver: Any) -> list[str]:
    """The texts of the runs list's rows, read in one go: the page redraws the list as runs change, so rows found
    before a redraw are read again after it."""
    By = _by()
    return list(wait_for(driver, lambda d: [r.text for r in d.find_elements(By.CSS_SELECTOR, "#runs-body tr")] or None))


def test_a_finished_run_shows_its_graph_and_timeline(server: Served, driver: Any, tmp_path: Path) -> None:
    By = _by()
    run = server.submit(
        "alice",
        {"steps": [
            {"id": "fetch", "tool": "echo", "args": {"urls": ["https://example.com", "https://example.org"]}},
            {"id": "each", "for_each": "${steps.fetch.output.urls}", "step": {"id": "one", "tool": "echo",
                                                                              "args": {"url": "${item}"}}},
            {"id": "report", "tool": "echo", "args": {"first": "${steps.fetch.output.urls.0}"}},
        ]},
    )  # fmt: skip
    assert server.wait("alice", run)["status"] == "completed"
    sign_in(driver, server.base, "alice")
    # The runs list shows the run; its link opens the run's page.
    click(driver, By.CSS_SELECTOR, f'a[href="/console/runs/{run}"]')
    wait_for(driver, lambda d: d.find_element(By.ID, "graph"))
    assert "state-ok" in _shape_class(driver, "fetch")
    assert "state-ok" in _shape_class(driver, "report")
    assert "state-ok" in _shape_class(driver, "each.*.one")  # both elements of the for_each
    # The timeline draws a bar for each step run, each naming its step.
    bars = driver.find_elements(By.CSS_SELECTOR, "svg.timeline g.bar title")
    titles = [b.get_attribute("textContent") for b in bars]
    assert any(t.startswith("fetch: ok") for t in titles) and any(t.startswith("report: ok") for t in titles)
    assert any(t.startswith("each.0.one: ok") for t in titles) and any(t.startswith("each.1.one: ok") for t in titles)
    # Each step's arguments and output are there, sized.
    row = driver.find_element(By.ID, "step-fetch")
    assert "https://example.com" in row.get_attribute("textContent")
    assert csp_violations(driver) == []
    save_shot(driver, "run", tmp_path)


def test_a_failing_parallel_branch_is_marked_on_the_graph(server: Served, driver: Any) -> None:
    By = _by()
    run = server.submit(
        "alice",
        {"steps": [
            {"id": "start", "tool": "echo", "args": {"n": 1}},
            {"id": "fan", "parallel": [
                {"id": "good", "tool": "echo", "args": {"n": 2}},
                {"id": "bad", "tool": "fail_now", "args": {"why": "the branch broke"}},
            ]},
            {"id": "after", "tool": "echo", "args": {}},
        ]},
    )  # fmt: skip
    assert server.wait("alice", run)["status"] == "failed"
    sign_in(driver, server.base, "alice")
    driver.get(f"{server.base}/console/runs/{run}")
    wait_for(driver, lambda d: d.find_element(By.ID, "graph"))
    assert "state-failed" in _shape_class(driver, "fan.bad")
    assert "state-ok" in _shape_class(driver, "fan.good")
    assert "state-failed" not in _shape_class(driver, "after")  # it never ran
    errors = driver.find_element(By.CSS_SELECTOR, "section.errors").text
    assert "fan.bad" in errors and "steps[1].parallel[1]" in errors and "E_BRANCH: the branch broke" in errors
    save_shot(driver, "run-failed", Path(os.environ.get("TMPDIR", "/tmp")))


def test_a_running_runs_events_arrive_live(server: Served, driver: Any, tmp_path: Path) -> None:
    By = _by()
    first, second = tmp_path / "first", tmp_path / "second"
    os.mkfifo(first)
    os.mkfifo(second)
    run = server.submit(
        "alice",
        {"steps": [
            {"id": "a", "tool": "echo", "args": {}},
            {"id": "b", "tool": "held", "args": {"fifo": str(first)}},
            {"id": "c", "tool": "held", "args": {"fifo": str(second)}},
        ]},
    )  # fmt: skip
    server.until_event("alice", run, "step_started", "b")
    sign_in(driver, server.base, "alice")
    driver.get(f"{server.base}/console/runs/{run}")
    wait_for(driver, lambda d: d.find_element(By.ID, "live").is_displayed())  # the event stream is open
    assert "state-running" in _shape_class(driver, "b")
    driver.execute_script("window.__same_page = true")  # gone if the page were loaded again
    _release(first)
    # b finishes and c starts, shown as they happen, on the same page (no reload, no polling by the page).
    wait_for(driver, lambda d: "state-running" in _shape_class(d, "c"))
    assert "state-ok" in _shape_class(driver, "b")
    # The list of events is drawn as they come, the graph's shapes too: read once it has c's start.
    events = wait_for(driver, lambda d: "step_started c" in (t := d.find_element(By.ID, "events").text) and t)
    assert "step_finished b" in events and "step_started c" in events
    assert driver.execute_script("return window.__same_page") is True
    _release(second)
    # The run's end reloads the page once: the finished run drawn by the server.
    wait_for(driver, lambda d: d.find_element(By.ID, "run-status").text == "completed")
    wait_for(driver, lambda d: d.execute_script("return window.__same_page") is None)
    assert "state-ok" in _shape_class(driver, "c")


def test_cancel_stops_a_running_run(server: Served, driver: Any) -> None:
    By = _by()
    run = server.submit("alice", {"steps": [{"id": "forever", "tool": "hang", "args": {}}]})
    server.until_event("alice", run, "step_started", "forever")
    sign_in(driver, server.base, "alice")
    driver.get(f"{server.base}/console/runs/{run}")
    click(driver, By.ID, "cancel")
    wait_for(driver, lambda d: d.find_element(By.ID, "run-status").text == "cancelled")
    assert server.call("alice", "pipe_status", {"run_id": run})["status"] == "cancelled"
    # The live page says "cancelled" just before it reloads into the finished run's: waited for, its buttons.
    wait_for(driver, lambda d: d.find_elements(By.ID, "retry") and not d.find_elements(By.ID, "cancel"))


def test_a_second_principal_sees_none_of_the_firsts_runs(server: Served, driver: Any) -> None:
    By = _by()
    run = server.submit("alice", {"steps": [{"id": "mine", "tool": "echo", "args": {"secret": "alice's"}}]})
    server.wait("alice", run)
    sign_in(driver, server.base, "bob")
    assert _rows(driver) == ["No runs match."]
    # Nor by its address, nor by the filters an operator has.
    driver.get(f"{server.base}/console/runs/{run}")
    assert "404" in driver.find_element(By.TAG_NAME, "h1").text
    assert "alice's" not in driver.page_source
    driver.get(f"{server.base}/console/runs?principal=alice")
    assert _rows(driver) == ["No runs match."]
    # The operator sees both principals' runs.
    sign_in(driver, server.base, "root")
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f'a[href="/console/runs/{run}"]'))


def test_a_tool_output_holding_a_script_is_shown_as_text(server: Served, driver: Any) -> None:
    By = _by()
    run = server.submit("alice", {"steps": [{"id": "html", "tool": "markup", "args": {}}]})
    server.wait("alice", run)
    sign_in(driver, server.base, "alice")
    driver.get(f"{server.base}/console/runs/{run}")
    wait_for(driver, lambda d: d.find_element(By.ID, "answer"))
    shown = driver.find_element(By.ID, "answer").get_attribute("textContent")
    assert "<script>window.__pwned = 1</script>" in shown and '<img src=\\"x\\"' in shown  # (as JSON text)
    assert driver.execute_script("return window.__pwned === undefined")
    assert not driver.find_elements(By.CSS_SELECTOR, "main b, main img")  # none of it became elements
    assert csp_violations(driver) == []


def test_the_main_pages_are_keyboard_usable_labelled_and_fit_a_phone(
    server: Served, driver: Any, tmp_path: Path
) -> None:
    By = _by()
    from selenium.webdriver.common.keys import Keys

    server.submit("bob", {"steps": [{"id": "s", "tool": "echo", "args": {}}]})
    sign_in(driver, server.base, "root")
    shots = []
    for page in ("runs", "servers", "metrics"):
        driver.set_window_size(1280, 1000)
        driver.get(f"{server.base}/console/{page}")
        if page == "metrics":  # the chart of calls/s drawn by the page as the metrics stream brings readings
            wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#rate polyline"))
        assert csp_violations(driver) == []
        shots.append(save_shot(driver, page, tmp_path))
        # The first Tab reaches the skip link; every field has a label.
        driver.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)
        assert driver.switch_to.active_element.text == "Skip to the content"
        unlabelled = driver.execute_script(
            "return [...document.querySelectorAll('input:not([type=hidden]), select')]"
            ".filter(e => !e.labels || e.labels.length === 0).map(e => e.name)"
        )
        assert unlabelled == []
        low = driver.execute_script(_CONTRAST)
        assert low == [], f"text below 4.5:1 contrast on {page}: {low[:5]}"
        # At a phone's width the page does not scroll sideways (wide tables scroll in their own box).
        driver.set_window_size(390, 844)
        driver.get(f"{server.base}/console/{page}")
        overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{page} is {overflow} px wider than a phone"
    assert all(s.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for s in shots)


_CONTRAST = """
function rgb(c) { const m = c.match(/[\\d.]+/g); return m ? m.map(Number) : [0, 0, 0, 0]; }
function lum(c) {
  const [r, g, b] = c.slice(0, 3).map(v => {
    v /= 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}
function background(e) {
  for (; e; e = e.parentElement) {
    const c = rgb(getComputedStyle(e).backgroundColor);
    if (c.length < 4 || c[3] > 0) return c;
  }
  return [255, 255, 255];
}
const low = [];
for (const e of document.querySelectorAll("main *, header *")) {
  if (e.closest("svg") || !e.childNodes.length) continue;
  if (![...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) continue;
  const fg = lum(rgb(getComputedStyle(e).color)), bg = lum(background(e));
  const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
  if (ratio < 4.5) low.push(e.tagName + " " + e.className + " " + ratio.toFixed(2));
}
return low;
"""


def _release(fifo: Path) -> None:
    """Write a line to a FIFO the server's ``held`` tool reads (opening it waits for the reader)."""
    done = threading.Event()

    def write() -> None:
        with open(fifo, "w") as f:
            f.write("go\n")
        done.set()

    threading.Thread(target=write, daemon=True).start()
    assert done.wait(60), f"nothing read {fifo}"
