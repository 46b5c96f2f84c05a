#!/usr/bin/env python3
"""Record NoETL's own answers for the golden playbooks (``make noetl-oracle``; outside CI).

The golden cases are listed in ``tests/formats/noetl/golden/4.26.0/MANIFEST.json``: each names a NoETL
playbook by its upstream path and commit, the playbooks it calls (registered first), and what its copy
rewrites (only hosts and ports, to the oracle kit's HTTP stand-in on 127.0.0.1:18080). This script:

1. ``--fetch GIT_DIR``: writes each case's copy again from a clone of noetl/noetl (``git show
   COMMIT:PATH``, then the rewrites), so the copies can be checked against their source;
2. starts the real NoETL 4.26.0 with the oracle kit (``../shared/noetl-oracle``: ``setup.sh 4.26.0``,
   ``stack.sh start 4.26.0``: its server and worker from PyPI, PostgreSQL and NATS on 127.0.0.1),
   registers the database credentials the playbooks name (``pg_local`` and ``pg_k8s``: the kit's
   ``demo``/``demo`` database), registers each case's callees, runs the case (``run.py --stable``) and
   writes its normalized result next to its copy (``NAME.json``);
3. stops the stack (``--keep`` leaves it up).

Environment: ``NOETL_ORACLE_KIT`` (the kit's folder, default ``../shared/noetl-oracle`` from the repository
root), ``NOETL_ORACLE_DIR`` (its work dir, default ``/tmp/mcpipe-noetl-oracle``: PostgreSQL runs as the
``postgres`` user, which must reach it), ``NOETL_ORACLE_PYTHON`` (a Python 3.12 for the kit).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = "4.26.0"
GOLDEN = ROOT / "tests" / "formats" / "noetl" / "golden" / VERSION
HOSTS = re.compile(
    r"https?://(httpbin\.org|api\.open-meteo\.com|api\.example\.com|jsonplaceholder\.typicode\.com"
    r"|10\.96\.86\.212:8082|noetl\.noetl\.svc\.cluster\.local:8082|paginated-api\.test-server\.svc\.cluster\.local:5555)"
)
STAND_IN = "http://127.0.0.1:18080"
CREDENTIALS = ("pg_local", "pg_k8s")


def manifest() -> list[dict[str, object]]:
    cases: list[dict[str, object]] = json.loads((GOLDEN / "MANIFEST.json").read_text())["playbooks"]
    return cases


def rewrite(text: str) -> str:
    """The only change a copy makes: public and cluster hosts to the kit's stand-in."""
    return HOSTS.sub(STAND_IN, text)


def fetch(git_dir: str) -> None:
    for case in manifest():
        text = subprocess.run(
            ["git", "--git-dir", git_dir, "show", f"{case['commit']}:{case['path']}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (GOLDEN / f"{case['name']}.yaml").write_text(rewrite(text))
        print(f"fetched {case['name']} <- {case['path']}@{str(case['commit'])[:10]}")


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        answer: dict[str, object] = json.loads(r.read() or b"{}")
        return answer


def record(kit: Path, python: str, env: dict[str, str], only: set[str]) -> int:
    stack = json.loads((Path(env["NOETL_ORACLE_DIR"]) / f"stack-{VERSION}.json").read_text())
    base, pg_port = stack["url"], stack["pg_port"]
    for name in CREDENTIALS:
        data = {"db_host": "127.0.0.1", "db_port": str(pg_port), "db_user": "demo", "db_password": "demo"}
        _post(f"{base}/api/credentials", {"name": name, "type": "postgres", "data": {**data, "db_name": "demo_noetl"}})
    failed = 0
    for case in manifest():
        name = str(case["name"])
        if case.get("role") == "callee" or (only and name not in only):
            continue
        for callee in case.get("calls", []):  # type: ignore[attr-defined]
            content = (GOLDEN / f"{callee}.yaml").read_text()
            _post(f"{base}/api/catalog/register", {"content": content, "resource_type": "Playbook"})
        proc = subprocess.run(
            [python, str(kit / "run.py"), str(GOLDEN / f"{name}.yaml"), "--version", VERSION, "--stable",
             "--timeout", str(case.get("timeout", 60)),
             *(["--workload", json.dumps(case["workload"])] if case.get("workload") else [])],
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        if proc.returncode != 0 or not proc.stdout.strip():
            print(f"{name}: run.py failed: {proc.stderr.strip()[-400:]}", file=sys.stderr)
            failed += 1
            continue
        result = json.loads(proc.stdout)
        (GOLDEN / f"{name}.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        print(f"{name}: {result['status']}")
    return failed


def _python312() -> str | None:
    """A ``python3.12`` on PATH that runs (a pyenv shim of a version not selected does not), else pyenv's."""
    found = shutil.which("python3.12")
    if found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0:
        return found
    for p in sorted(Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")).glob("versions/3.12*/bin/python3.12")):
        return str(p)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--fetch", metavar="GIT_DIR", help="write the copies again from a clone of noetl/noetl first")
    ap.add_argument("--keep", action="store_true", help="leave the stack running")
    ap.add_argument("--no-run", action="store_true", help="only --fetch")
    ap.add_argument("cases", nargs="*", help="record only these cases")
    args = ap.parse_args()
    if args.fetch:
        fetch(args.fetch)
    if args.no_run:
        return 0
    kit = Path(os.environ.get("NOETL_ORACLE_KIT", ROOT.parent / "shared" / "noetl-oracle")).resolve()
    if not (kit / "run.py").exists():
        print(f"no oracle kit at {kit} (set NOETL_ORACLE_KIT)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.setdefault("NOETL_ORACLE_DIR", "/tmp/mcpipe-noetl-oracle")
    Path(env["NOETL_ORACLE_DIR"]).mkdir(parents=True, exist_ok=True)
    python = env.get("NOETL_ORACLE_PYTHON") or _python312() or sys.executable
    subprocess.run([str(kit / "setup.sh"), VERSION], check=True, env=env)
    subprocess.run([str(kit / "stack.sh"), "start", VERSION], check=True, env=env)
    try:
        return 1 if record(kit, python, env, set(args.cases)) else 0
    finally:
        if not args.keep:
            subprocess.run([str(kit / "stack.sh"), "stop", VERSION], env=env)


if __name__ == "__main__":
    sys.exit(main())
