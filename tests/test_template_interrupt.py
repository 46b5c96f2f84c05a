"""A template render's deadline is enforced by raising an exception in its thread (CPython's
``PyThreadState_SetAsyncExc``). What a render leaves behind must not reach the rest of the process: neither an
interruption in the code its thread runs next, nor CPython's "asynchronous exception pending" flag, which
cleared with NULL stays set for good (every thread then takes the eval loop's slow path, and under a profiler,
``python -m cProfile -m mcpipe playbook run ...``, the event loop spun at 100% CPU after the first render)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import trio

from mcpipe._deadline import expression_timeout_ms, set_expression_timeout
from mcpipe.expr._jinja import RenderError, compile_value, render, render_async

PROFILED_AFTER_RENDERS = textwrap.dedent(
    """
    import trio
    from mcpipe._deadline import set_expression_timeout
    from mcpipe.expr._jinja import RenderError, compile_value, render, render_async

    problems = []
    quick = compile_value("{{ a }} x", "here", problems)
    slow = compile_value("{% for i in xs %}{% for j in xs %}{% endfor %}{% endfor %}", "slow", problems)
    assert not problems, problems
    assert render(quick, {"a": 1}, "here") == "1 x"

    async def main():
        assert await render_async(quick, {"a": 2}, "here") == "2 x"
        set_expression_timeout(50)
        try:
            await render_async(slow, {"xs": list(range(100_000))}, "slow")
        except RenderError as e:
            assert "took longer than" in str(e), e
        for _ in range(50):
            await trio.sleep(0)
        return "resumed"

    print(trio.run(main))
    """
)


def test_a_profiled_event_loop_goes_on_after_renders_quick_and_interrupted(tmp_path):
    # Before, this hung at 100% CPU (killed by the timeout below, which only bounds a hang).
    script = tmp_path / "renders.py"
    script.write_text(PROFILED_AFTER_RENDERS)
    done = subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(tmp_path / "profile"), str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "resumed"


def test_an_interrupted_render_leaves_nothing_pending_for_the_threads_next_work():
    problems: list[tuple[str, str]] = []
    slow = compile_value("{% for i in xs %}{% for j in xs %}{% endfor %}{% endfor %}", "slow", problems)
    quick = compile_value("{{ a }}", "quick", problems)
    assert problems == []
    before = expression_timeout_ms()
    set_expression_timeout(20)
    try:
        for _ in range(5):
            try:
                render(slow, {"xs": list(range(100_000))}, "slow")
            except RenderError as e:
                assert e.code == "TIMEOUT"
            # Plain code in the same thread afterwards: an injection left pending would raise here.
            total = 0
            for i in range(100_000):
                total += i
            assert total == 4_999_950_000
            assert render(quick, {"a": "ok"}, "quick") == "ok"

        async def in_threads() -> None:
            for _ in range(3):
                try:
                    await render_async(slow, {"xs": list(range(100_000))}, "slow")
                except RenderError as e:
                    assert e.code == "TIMEOUT"
                assert await render_async(quick, {"a": "ok"}, "quick") == "ok"

        trio.run(in_threads)
    finally:
        set_expression_timeout(before)
