"""The fork server's image: a real fork server holds no module beyond ``_zygote.IMAGE`` (and the interpreter's
own start-up), and what left it (orjson, ``tempfile``/``shutil``, ``ctypes``, the role's ``inspect``, ``ast``,
``traceback``, ``decimal``, ``base64``) changed nothing a step sees: integers past 64 bits, a worker's
directory and what a step leaves in it, a ``main`` read by ``inspect``, a failing step's traceback."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from kit.declared import compiled, env
from mcpipe._sandbox import SANDBOX, _zygote, fork_server_env
from mcpipe.declared import StepPolicy
from mcpipe.kinds import PythonPolicy, _pyexec
from mcpipe.tools._base import ToolContext

POLICY = StepPolicy(python=PythonPolicy(timeout_ms=20_000))


async def run(code: str, input: object = None, policy: StepPolicy = POLICY):
    raw: dict[str, object] = {"kind": "python", "code": code}
    if input is not None:
        raw["input"] = input
    with trio.fail_after(30):
        return await compiled(raw, policy).execute(env(), ToolContext())


def _started_with() -> set[str]:
    """The modules of the interpreter's own start, as the fork server is started (``-I``, its environment)."""
    out = subprocess.run(
        [sys.executable, "-I", "-c", "import sys; print(' '.join(sys.modules))"],
        env=fork_server_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


async def test_a_started_fork_server_holds_only_the_modules_of_its_image():
    import mcpipe.kinds._pyworker  # noqa: F401 (registers the python role)

    SANDBOX.stop()  # a fork server of this tree, started now
    z = await SANDBOX.zygote()
    assert z.modules, "the fork server says what it holds in its first message"
    extra = set(z.modules) - _started_with()
    assert extra - _zygote.IMAGE == set()
    assert {"json", "socket", "datetime", "uuid", "mcpipe._core"} <= extra  # (the test sees the fork server's imports)
    left_out = {"orjson", "typing", "tempfile", "shutil", "inspect", "ast", "traceback", "decimal", "base64"}
    left_out |= {"ctypes", "mcpipe"}  # (its system calls are the Rust core's, loaded by path, not ctypes')
    assert left_out & extra == set()


async def test_a_python_steps_input_and_result_keep_integers_past_64_bits():
    big = 2**70 + 1
    out = await run("result = {'type': type(x).__name__, 'text': str(x), 'x': x, 'neg': -x}", {"x": big})
    assert out.ok, out.error
    assert out.output == {"type": "int", "text": str(big), "x": big, "neg": -big}


async def test_a_steps_directory_is_new_private_and_randomly_named():
    out = await run("import os, stat\nresult = [os.getcwd(), stat.S_IMODE(os.stat('.').st_mode), os.listdir('.')]")
    assert out.ok, out.error
    cwd, mode, listed = out.output
    name = Path(cwd).name
    assert name.startswith(_zygote.DIR_PREFIX) and len(name) == len(_zygote.DIR_PREFIX) + 12
    int(name[len(_zygote.DIR_PREFIX) :], 16)
    assert (mode, listed) == (0o700, [])


async def test_the_links_a_step_left_in_its_directory_are_removed_and_what_they_point_to_untouched(tmp_path):
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "kept.txt").write_text("kept")
    (outside / "sub" / "deep.txt").write_text("deep")
    os.chmod(tmp_path, 0o755)
    os.chmod(outside, 0o777)  # (a worker with a uid of its own may see it; it must not be emptied)
    code = (
        "import os\n"
        "os.symlink(target, 'to_dir')\n"
        "os.symlink(target + '/kept.txt', 'to_file')\n"
        "os.makedirs('a/b')\n"
        "os.symlink(target, 'a/b/inner_to_dir')\n"
        "os.symlink('/nonexistent/anywhere', 'a/dangling')\n"
        "open('a/b/f.txt', 'w').write('x')\n"
        "result = os.getcwd()"
    )
    out = await run(code, {"target": str(outside)})
    assert out.ok, out.error
    cwd = trio.Path(out.output)
    with trio.fail_after(10):
        while await cwd.exists() or await cwd.is_symlink():  # noqa: ASYNC110 (removed as the worker is reaped)
            await trio.sleep(0.01)
    assert sorted(p.relative_to(outside).as_posix() for p in outside.rglob("*")) == ["kept.txt", "sub", "sub/deep.txt"]
    assert (outside / "kept.txt").read_text() == "kept"


def test_removing_a_directory_never_follows_a_link_out_of_it(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "precious").write_text("p")
    d = Path(tempfile.mkdtemp(prefix=_zygote.DIR_PREFIX, dir=tmp_path))
    (d / "x" / "y").mkdir(parents=True)
    (d / "x" / "y" / "f").write_text("f")
    (d / "x" / "link").symlink_to(target)
    (d / "link").symlink_to(target / "precious")
    _zygote.remove_dir(str(d))
    assert not d.exists()
    assert (target / "precious").read_text() == "p"
    # The directory itself replaced by a link: the link goes.
    link = Path(tempfile.mkdtemp(prefix=_zygote.DIR_PREFIX, dir=tmp_path))
    link.rmdir()
    link.symlink_to(target)
    _zygote.remove_dir(str(link))
    assert not link.is_symlink() and (target / "precious").exists()


def test_the_roles_own_flags_and_kinds_are_inspects():
    assert _pyexec._ASYNC_FLAGS == inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR
    assert (_pyexec._CO_VARARGS, _pyexec._CO_VARKEYWORDS) == (inspect.CO_VARARGS, inspect.CO_VARKEYWORDS)
    P = inspect.Parameter
    kinds = [P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD, P.VAR_POSITIONAL, P.KEYWORD_ONLY, P.VAR_KEYWORD]
    ours = [_pyexec._POSITIONAL_ONLY, _pyexec._NAMED, _pyexec._VAR_POSITIONAL, _pyexec._KEYWORD_ONLY]
    assert [*ours, _pyexec._VAR_KEYWORD] == kinds


@pytest.mark.parametrize(
    ("code", "input", "expected"),
    [
        # a main that is no plain function: its signature read by inspect, imported at first use
        ("import functools\ndef deco(f):\n    @functools.wraps(f)\n    def w(*a, **k):\n        return f(*a, **k)\n"
         "    return w\n@deco\ndef main(a, b=2, *, c=3):\n    return [a, b, c]", {"a": 1, "c": 5}, [1, 2, 5]),
        ("class M:\n    def __call__(self, a, k=0):\n        return a + k\nmain = M()", {"a": 4, "k": 1}, 5),
        # what json cannot write: a Decimal (the code imported decimal), bytes as base64, times
        ("import decimal\nresult = [decimal.Decimal('2'), decimal.Decimal('2.5'), b'\\x00\\xffab']", {},
         [2, 2.5, "AP9hYg=="]),
        ("result = [datetime.date(2026, 12, 7), uuid.UUID(int=1), {1, 1}]", {},
         ["2026-12-07", "00000000-0000-0000-0000-000000000001", [1]]),
    ],
    ids=["decorated-main", "callable-main", "decimal-bytes", "date-uuid-set"],
)  # fmt: skip
async def test_what_the_role_imports_at_first_use_gives_what_it_gave_imported_ahead(code, input, expected):
    out = await run(code, input)
    assert out.ok, out.error
    assert out.output == expected


async def test_a_failing_step_still_has_its_traceback_and_line():
    out = await run("x = 1\ndef main():\n    return {}['missing']\n")
    assert not out.ok
    text = str(out.error)
    assert "KeyError" in text and "missing" in text
    assert "line 3" in text


def test_a_steps_program_text_is_base64_of_its_marshalled_code():
    import base64
    import marshal

    program = _pyexec.compile_step("result = 1")
    text = _pyexec.program_text(program)
    assert text == base64.b64encode(marshal.dumps(program)).decode("ascii")
    assert _pyexec._program(text).co_code == program.co_code
