"""Check the wheel `make wheel` built: one abi3 wheel for CPython 3.11+ (manylinux-tagged on Linux), which
installs into a fresh virtual environment with no Rust toolchain reachable, imports, resolves a template,
runs a pipeline, and carries the console's templates and assets (it draws a pipeline as SVG, and renders a
page from its installed templates).

    python scripts/check_wheel.py dist
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

CONSOLE_FILES = (
    "mcpipe/console/templates/base.html",
    "mcpipe/console/templates/run.html",
    "mcpipe/console/templates/runs.html",
    "mcpipe/console/static/console.css",
    "mcpipe/console/static/console.js",
)
"""Files the web console needs at run time (no CDN: they are in the wheel)."""

CONSOLE_SMOKE = """
from mcpipe.console._app import _environment
page = _environment().get_template("error.html").render(
    prefix="/console", api="/api/v1", name_of_server="x", viewer=None,
    error=type("E", (), {"status": 404, "code": "NOT_FOUND", "message": "<b>"})())
assert "&lt;b&gt;" in page and "console.js" in page
print("ok")
"""

SMOKE = """
import mcpipe
from mcpipe import Template
assert Template("${vars.a}-{{step1.b}}", step_ids=["s"]).resolve(
    {"vars": {"a": 1}, "steps": {"s": {"output": {"b": "x"}}}}
) == "1-x"
print(mcpipe.__version__)
"""


PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: wheel_check
  path: checks/wheel
workflow:
  - step: start
    tool:
      kind: python
      code: |
        def main():
            return {"doubled": 21 * 2}
    next:
      - step: end
  - step: end
    tool:
      kind: noop
"""
"""A python step: it runs in a worker of the sandbox's fork server, which loads the installed core by path."""


def _result(answer: str) -> object:
    """The pipeline's result in ``mcpipe run``'s answer (None when it is not one)."""
    try:
        return json.loads(answer).get("result")
    except (ValueError, AttributeError):
        return None


def main(dist: str) -> int:
    wheels = sorted(Path(dist).glob("mcpipe-*.whl"))
    if len(wheels) != 1:
        print(f"check_wheel: expected one mcpipe wheel in {dist}, found {[w.name for w in wheels]}", file=sys.stderr)
        return 1
    wheel = wheels[0]
    if "-cp311-abi3-" not in wheel.name:
        print(f"check_wheel: {wheel.name} is not an abi3 wheel for CPython 3.11+", file=sys.stderr)
        return 1
    if sys.platform == "linux" and "-manylinux_" not in wheel.name:
        print(f"check_wheel: {wheel.name} is not manylinux-tagged (maturin's --compatibility)", file=sys.stderr)
        return 1
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in CONSOLE_FILES if f not in names]
    if missing:
        print(f"check_wheel: {wheel.name} lacks the console's {', '.join(missing)}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="mcpipe-wheel-") as tmp:
        venv = Path(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        bin_dir = venv / "bin"
        # No cargo or rustc on PATH, and any build step that still looked for them would fail.
        env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "CARGO": "/bin/false", "RUSTC": "/bin/false"}
        env.pop("VIRTUAL_ENV", None)
        pip = [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--only-binary", ":all:", str(wheel)]
        subprocess.run(pip, check=True, env=env)
        version = subprocess.run(
            [str(bin_dir / "python"), "-c", SMOKE], check=True, env=env, capture_output=True, text=True, cwd=tmp
        ).stdout.strip()
        cli = subprocess.run(
            [str(bin_dir / "mcpipe"), "--version"], check=True, env=env, capture_output=True, text=True, cwd=tmp
        ).stdout.strip()
        join = {"tool": "text_join", "args": {"items": ["a", "b"], "sep": "+"}}
        spec = json.dumps({"steps": [join], "return": "${last.structured.text}"})
        run = subprocess.run(
            [str(bin_dir / "mcpipe"), "run", "-"], input=spec, env=env, capture_output=True, text=True, cwd=tmp
        )
        if cli != f"mcpipe {version}" or run.returncode != 0 or _result(run.stdout) != "a+b":
            print(
                f"check_wheel: the installed wheel misbehaves: {cli!r}, {run.stdout!r} {run.stderr!r}", file=sys.stderr
            )
            return 1
        Path(tmp, "playbook.yaml").write_text(PLAYBOOK)
        played = subprocess.run(
            [str(bin_dir / "mcpipe"), "playbook", "run", "playbook.yaml"],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp,
        )
        try:
            doubled = json.loads(played.stdout)["steps"]["start"]["output"]["doubled"]
        except (ValueError, KeyError, TypeError):
            doubled = None
        if played.returncode != 0 or doubled != 42:
            print(
                f"check_wheel: the installed wheel's python step misbehaves: {played.stdout!r} {played.stderr!r}",
                file=sys.stderr,
            )
            return 1
        Path(tmp, "spec.json").write_text(spec)
        drawn = subprocess.run(
            [str(bin_dir / "mcpipe"), "explain", "spec.json", "--format", "svg"],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp,
        )
        page = subprocess.run(
            [str(bin_dir / "python"), "-c", CONSOLE_SMOKE], env=env, capture_output=True, text=True, cwd=tmp
        )
        if drawn.returncode != 0 or "<svg" not in drawn.stdout or page.stdout.strip() != "ok":
            print(
                f"check_wheel: the installed wheel's console misbehaves: {drawn.stderr!r} {page.stderr!r}",
                file=sys.stderr,
            )
            return 1
    print(f"check_wheel: {wheel.name} installs without a Rust toolchain and works (mcpipe {version})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "dist"))
