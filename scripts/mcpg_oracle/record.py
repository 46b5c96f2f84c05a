"""Record the goldens of tests/formats/mcpg/golden/ from the real mcpg (`make mcpg-goldens`).

- ``config-check.json``: mcpg's verdict on every config of ``INDEX.json`` (``.mcpg/bin/mcpg-config-check``).
- ``served/<case>.json``: each case of ``tests/formats/mcpg/cases.yaml`` served by ``.mcpg/bin/mcpg`` with
  its outside services replaced by real servers on 127.0.0.1, called over MCP; the golden holds the exact
  config (a template), the services, the calls with mcpg's responses and what the services received.

    python scripts/mcpg_oracle/record.py [--upstream DIR] [--check-only | --served-only] [CASE ...]

``--upstream``: the vendored configs with their ``INDEX.json`` (default ``tests/formats/mcpg/upstream``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import MCPG, PLUGINS, ROOT, BootFailed, serving

from kit.mcpg_oracle import mask, oracle_overlay, render, render_env, rewrite_hosts, run_calls, services

HERE = ROOT / "tests" / "formats" / "mcpg"
GOLDEN = HERE / "golden"
CHECK = ROOT / ".mcpg" / "bin" / "mcpg-config-check"


def dump(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n")


def record_config_check(upstream: Path) -> dict[str, Any]:
    index: dict[str, str] = json.loads((upstream / "INDEX.json").read_text())
    files = [str(upstream / f) for f in index.values()]
    out = subprocess.run([str(CHECK), *files], capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"mcpg-config-check failed ({out.returncode}): {out.stderr[-2000:]}")
    by_file = {}
    for line in out.stdout.splitlines():
        verdict = json.loads(line)
        by_file[verdict.pop("file")] = verdict
    golden: dict[str, Any] = {}
    for key, rel in sorted(index.items()):
        verdict = by_file[str(upstream / rel)]
        # The vendored copy's folder is not mcpg's: name files relative to it.
        golden[key] = json.loads(json.dumps(verdict).replace(str(upstream) + "/", ""))
    dump(GOLDEN / "config-check.json", golden)
    accepted = sum(1 for v in golden.values() if v["accepted"])
    print(f"config-check: {len(golden)} configs, {accepted} accepted, {len(golden) - accepted} refused by mcpg")
    return golden


def case_template(case: dict[str, Any], upstream: Path) -> str:
    source = case["source"]
    if source.startswith("cases/"):
        text = (HERE / source).read_text()
    else:
        index = json.loads((upstream / "INDEX.json").read_text())
        text = (upstream / index[source]).read_text()
    doc = yaml.safe_load(text)
    doc = rewrite_hosts(doc, case.get("hosts") or {})
    doc = oracle_overlay(doc, trust_floor=case.get("trust_floor", True))
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1000)


def record_case(name: str, case: dict[str, Any], upstream: Path) -> dict[str, Any]:
    template = case_template(case, upstream)
    golden: dict[str, Any] = {
        "case": name,
        "source": case["source"],
        "hosts": case.get("hosts") or {},
        "env": case.get("env") or {},
        "services": case.get("services") or {},
        "answers": case.get("answers") or {},
        "config": template,
    }
    with tempfile.TemporaryDirectory(prefix="mcpg-oracle-") as tmp:
        scratch = Path(tmp)
        with services(golden["services"], scratch) as run:
            config = scratch / "config.yaml"
            config.write_text(render(template, run.ports, str(scratch), str(PLUGINS)))
            env = render_env(golden["env"], run.ports, str(scratch))
            started = time.monotonic()
            try:
                with serving("mcpg", config, run.ports["mcp"], env, scratch / "server.log") as url:
                    golden["boot"] = {"ok": True}
                    golden["calls"] = run_calls(url, case.get("calls") or [], run, golden["answers"])
            except BootFailed as e:
                log = mask(e.log, run.ports, str(scratch)).replace(str(PLUGINS), "{{plugins}}")
                lines = log.strip().splitlines()
                said = [line for line in lines if line.startswith("Error:")] or lines[-15:]
                golden["boot"] = {"ok": False, "error": str(e), "log": said}
                golden["calls"] = []
            seconds = time.monotonic() - started
            # The server's log and the exact config, for reading afterwards (.mcpg/logs/, git-ignored).
            logs = ROOT / ".mcpg" / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            if (scratch / "server.log").exists():
                (logs / f"{name}.log").write_bytes((scratch / "server.log").read_bytes())
            (logs / f"{name}.yaml").write_text(config.read_text())
    calls = golden["calls"]
    errors = sum(1 for c in calls if "error" in c["response"] or (c["response"].get("result") or {}).get("isError"))
    boot = "ok" if golden["boot"]["ok"] else "FAILED"
    print(f"{name}: boot={boot} {len(calls)} calls ({errors} errors) {seconds:.1f}s")
    return golden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", default=str(HERE / "upstream"))
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("--served-only", action="store_true")
    parser.add_argument("cases", nargs="*")
    ns = parser.parse_args()
    upstream = Path(ns.upstream).resolve()
    if not (upstream / "INDEX.json").exists():
        raise SystemExit(f"{upstream}/INDEX.json is missing (scripts/vendor_mcpg.py writes it)")
    if not MCPG.exists():
        raise SystemExit(f"{MCPG} is missing: it is built outside this repository (docs/formats/mcpg.md)")
    if not ns.served_only:
        record_config_check(upstream)
    if ns.check_only:
        return
    cases: dict[str, Any] = yaml.safe_load((HERE / "cases.yaml").read_text())
    for name in ns.cases or list(cases):
        dump(GOLDEN / "served" / f"{name}.json", record_case(name, cases[name], upstream))


if __name__ == "__main__":
    main()
