"""The collector of a serving process (``mcpipe.server._heap``): what is loaded at the start frozen, garbage
made while serving still collected. Each test runs in a process of its own (freezing the test process's heap
would keep every later test's garbage)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_settle_freezes_what_is_loaded_and_garbage_made_while_serving_is_still_collected():
    out = _run(
        """
        import gc, weakref
        from mcpipe.server._heap import YOUNG, settle

        class Node:
            pass

        def cycle():
            a, b = Node(), Node()
            a.other, b.other = b, a
            return weakref.ref(a)

        before = cycle()  # garbage from the start: collected by settle, not frozen with the rest
        settle()
        assert before() is None, "garbage of the start was frozen"
        assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
        assert gc.get_threshold()[0] == YOUNG
        later = cycle()
        gc.collect()
        print("collected" if later() is None else "kept")
        """
    )
    assert out == "collected"


def test_thaw_gives_the_frozen_objects_back_to_the_collector():
    out = _run(
        """
        import gc, weakref
        from mcpipe.server._heap import settle, thaw

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        settle()  # a live cycle, frozen (the config a reload replaces)
        del a, b
        gc.collect()
        kept = ref() is not None
        thaw()
        gc.collect()
        print(kept, gc.get_freeze_count(), ref() is None)
        """
    )
    assert out == "True 0 True"
