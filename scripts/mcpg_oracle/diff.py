"""mcpg and ``mcpipe serve --config`` side by side on the recorded cases (`make mcpg-diff`).

For each golden of tests/formats/mcpg/golden/served/ (or the cases named): the services are started as
recorded, the same config file is served by the real mcpg (``.mcpg/bin/mcpg``) and by
``mcpipe serve --config <file>`` in turn, the same calls are made to both over MCP, and every difference
is printed: mcpipe against mcpg now, and mcpg now against its golden (a moving oracle would show there).

    python scripts/mcpg_oracle/diff.py [--no-mcpg] [--write-not-yet] [CASE ...]

Differences kept on purpose (``KEPT`` of ``tests/kit/mcpg_oracle.py``, each with its reason in
docs/formats/mcpg.md) are not printed as differences: each case says which of them it needed.

``--write-not-yet`` also rewrites ``tests/formats/mcpg/not_yet.json``: per served case the reasons kept on
purpose it needs (``kept``: the CI test excuses those and nothing else), and per served case and per config of
``config-check.json`` where mcpipe does not yet answer as mcpg did, the first difference (the CI test
marks those xfail). Exit status 0 when mcpipe agrees with mcpg on every case, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import PLUGINS, ROOT, BootFailed, serving

from kit.mcpg_oracle import KEPT, compare, mask, render, render_env, run_calls, services

HERE = ROOT / "tests" / "formats" / "mcpg"
SERVED = HERE / "golden" / "served"


def check_differences() -> dict[str, str]:
    """Per config of config-check.json that mcpipe judges otherwise than mcpg: why."""
    sys.path.insert(0, str(ROOT / "python"))
    from mcpipe.config import parse_config
    from mcpipe.errors import ConfigError

    upstream = HERE / "upstream"
    index = json.loads((upstream / "INDEX.json").read_text())
    checks = json.loads((HERE / "golden" / "config-check.json").read_text())
    out = {}
    for key, verdict in sorted(checks.items()):
        path = upstream / index[key]
        try:
            # as `mcpipe check --config` judges it: an unset variable is a warning (mcpg's check reads no env)
            parse_config(path.read_text(), "yaml", base_dir=str(path.parent), environ={}, warnings=[])
            accepted, said = True, ""
        except ConfigError as e:
            accepted, said = False, str(e).splitlines()[0]
        if accepted != verdict["accepted"]:
            if verdict["accepted"]:
                out[key] = f"mcpg accepts it; mcpipe refuses: {said}"[:300]
            else:
                first = verdict["message"].splitlines()[0]
                out[key] = f"mcpg refuses it ({verdict['stage']}: {first}); mcpipe accepts it"[:300]
    return out


def run_one(which: str, golden: dict[str, Any]) -> tuple[bool, list[dict[str, Any]], str]:
    """Serve the golden's config with ``which``; (booted, the calls, the boot error)."""
    with tempfile.TemporaryDirectory(prefix=f"mcpg-diff-{which}-") as tmp:
        scratch = Path(tmp)
        with services(golden["services"], scratch) as run:
            config = scratch / "config.yaml"
            config.write_text(render(golden["config"], run.ports, str(scratch), str(PLUGINS)))
            env = render_env(golden["env"], run.ports, str(scratch))
            try:
                with serving(which, config, run.ports["mcp"], env, scratch / "server.log") as url:
                    return True, run_calls(url, golden["calls"], run, golden["answers"]), ""
            except BootFailed as e:
                log = mask(e.log, run.ports, str(scratch)).strip().splitlines()[-5:]
                return False, [], f"{e}: " + " | ".join(log)
            except Exception as e:  # a server that breaks the client mid-session is a difference too
                return True, [], f"the session failed: {type(e).__name__}: {e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-mcpg", action="store_true", help="compare mcpipe with the goldens only")
    parser.add_argument("--write-not-yet", action="store_true", help="rewrite tests/formats/mcpg/not_yet.json")
    parser.add_argument("cases", nargs="*")
    ns = parser.parse_args()
    paths = [SERVED / f"{c}.json" for c in ns.cases] if ns.cases else sorted(SERVED.glob("*.json"))
    agree = 0
    not_yet: dict[str, str] = {}
    kept: dict[str, list[str]] = {}
    for path in paths:
        golden = json.loads(path.read_text())
        name = golden["case"]
        if ns.no_mcpg:
            reference_ok, reference, reference_err = golden["boot"]["ok"], golden["calls"], ""
        else:
            reference_ok, reference, reference_err = run_one("mcpg", golden)
            drift = compare(golden["calls"], reference) if reference_ok == golden["boot"]["ok"] else ["boot"]
            for d in drift:
                print(f"{name}: mcpg vs its golden: {d}")
        ok, calls, err = run_one("mcpipe", golden)
        if not reference_ok:
            diffs = [] if not ok else [f"mcpg refuses to serve ({reference_err}); mcpipe serves it"]
        elif not ok:
            diffs = [f"mcpipe did not serve the config: {err}"]
        else:
            used: set[str] = set()
            diffs = compare(reference, calls, KEPT, used) if calls or not err else [err]
            if used:
                kept[name] = sorted(used)
                print(f"{name}: kept on purpose: {', '.join(sorted(used))}")
        for d in diffs:
            print(f"{name}: mcpipe vs mcpg: {d}")
        if diffs:
            not_yet[name] = f"{len(diffs)} differences from mcpg, first: {diffs[0]}"[:300]
        agree += not diffs
        print(f"== {name}: {'same' if not diffs else f'{len(diffs)} differences'}")
    print(f"mcpg-diff: {agree} of {len(paths)} cases answered the same by mcpipe and mcpg")
    if ns.write_not_yet:
        checks = check_differences()
        print(f"mcpg-diff: mcpipe judges {len(checks)} configs of config-check.json otherwise than mcpg")
        target = HERE / "not_yet.json"
        known = json.loads(target.read_text()) if target.exists() else {}
        served, kept_before = known.get("served", {}), known.get("kept", {})
        for path in paths:  # the cases run now replace what was known of them
            served.pop(path.stem, None)
            kept_before.pop(path.stem, None)
        served.update(not_yet)
        kept_before.update(kept)
        out = {"served": served, "kept": kept_before, "config-check": checks}
        target.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    sys.exit(0 if agree == len(paths) else 1)


if __name__ == "__main__":
    main()
