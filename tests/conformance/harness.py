"""The official MCP conformance suite, against the fixture everything-server directly and through mcpipe.

    python tests/conformance/harness.py            # every mode; exit 1 if a check lost on the way
    python tests/conformance/harness.py http stdio # some modes

The suite (``../shared/conformance/run``, node 20) runs every non-extension server scenario in both protocol
eras, first against the fixture (``everything_server.py``) directly, then against ``mcpipe serve`` put in
front of it (``mcpServers``, ``prefix = ""``), with mcpipe reaching the fixture over streamable HTTP (mode
``http``) or stdio (mode ``stdio``). Every check that passes directly must pass through mcpipe, except those
listed in :data:`PENDING` (work delivered separately; the harness reports them, and fails when one passes
everywhere, so that its entry goes and its checks count from then on). Neither server may log a traceback.
The run fails, too, when fewer checks ran than it knows should: the direct run of each era must pass at least
:data:`DIRECT_FLOOR` checks and run every server scenario ``run list`` names for that era; modes ``alone`` and
``tasks`` have floors of their own.
Mode ``oauth`` runs the suite's client ``auth/*`` scenarios with mcpipe's downstream connection as the client
(``oauth_client.py``): every check must pass but those of the scenarios :data:`NOT_TAKEN` names, with why.
Mode ``alone`` runs mcpipe with no downstream server: a declared pipeline plays the suite's logging tool,
and logging-set-level and tools-call-with-logging must pass. Mode ``tasks`` runs every ``tasks-*`` scenario
(the tasks extension, ``docs/runs.md``) against mcpipe serving the fixture tools of ``tests/kit/tasks_fixture.py``
on its run queue: every check must pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FIXTURE = HERE / "everything_server.py"
ERAS = ("2025-11-25", "2026-07-28")
MODES = ("http", "stdio", "alone", "tasks", "oauth")
TESTS = HERE.parent

PENDING: dict[str, str] = {}
"""Scenarios whose checks may still be lost through mcpipe, and why. When one passes everywhere, the harness
says so: remove its entry then."""

STDIO_SSE_POLL_MS = 150
"""mcpipe's SSE polling of the stdio fixture's calls: well inside test_reconnection's 200 ms sleep."""

PENDING_TRACEBACKS: tuple[str, ...] = ()
"""Tracebacks of pending work (none)."""

DIRECT_FLOOR = {"2025-11-25": 84, "2026-07-28": 136}
"""The fewest checks that must pass against the fixture directly, per era (as many as pass today): a suite
that crashed half-way, or a fixture that regressed, would otherwise make fewer checks to compare and the run
would still pass. Raise it when more pass; lower it only on purpose (a scenario the suite dropped)."""

ALONE_FLOOR = 4
"""The fewest checks of mode ``alone`` (two per scenario of :data:`ALONE`) that must run and pass."""

TASKS_FLOOR = 44
"""The fewest checks of the ``tasks-*`` scenarios that must run and pass."""

ALONE = {"logging-set-level", "tools-call-with-logging"}

ALONE_CONFIG = """
audit = { enabled = false }

[[pipelines]]
name = "test_tool_with_logging"
description = "Sends three log messages while it runs (the conformance suite's logging tool)"

[[pipelines.steps]]
kind = "log"
id = "started"
data = "Tool execution started"

[[pipelines.steps]]
kind = "log"
id = "processing"
data = "Tool processing data"

[[pipelines.steps]]
kind = "log"
id = "completed"
data = "Tool execution completed"
"""


def suite() -> list[str]:
    runner = os.environ.get("MCP_CONFORMANCE") or str(ROOT.parent / "shared" / "conformance" / "run")
    return [runner]


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def traceback(self, expected: tuple[str, ...] = ()) -> str | None:
        """The first traceback in the server's log not caused by pending work (nor ``expected``), or None."""
        text = self.log.read_text(errors="replace")
        for chunk in text.split("Traceback (most recent call last)")[1:]:
            if not any(marker in chunk for marker in (*PENDING_TRACEBACKS, *expected)):
                return chunk[:3000]
        return None


@contextmanager
def started(
    args: list[str], log: Path, marker: str | None, cwd: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """Start a server; its URL is the first stdout line (``marker`` None) or follows ``marker`` on stderr."""
    with open(log, "wb") as err:
        if marker is None:
            proc = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd, env=env
            )
            assert proc.stdout is not None
            url = proc.stdout.readline().decode().strip()
        else:
            proc = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd, env=env
            )
            url = ""
            deadline = time.monotonic() + 60
            while not url and time.monotonic() < deadline and proc.poll() is None:
                text = log.read_text(errors="replace")
                if marker in text:
                    url = text.split(marker, 1)[1].split()[0]
                else:
                    time.sleep(0.05)
        if not url:
            proc.kill()
            raise RuntimeError(f"{args[1]} did not start: {log.read_text(errors='replace')[-2000:]}")
        try:
            yield Server(proc, url, log)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_suite(url: str, era: str | None, out: Path, scenarios: set[str] | None = None) -> dict[tuple[str, str], str]:
    """Run the suite; (scenario, check id) -> status. ``scenarios``: only these (default: the whole suite);
    ``era`` None for extension scenarios (not on the spec's timeline: the suite runs them at no version)."""
    out.mkdir(parents=True, exist_ok=True)
    runs = [["--suite", "all"]] if scenarios is None else [["--scenario", s] for s in sorted(scenarios)]
    version = [] if era is None else ["--spec-version", era]
    for extra in runs:
        subprocess.run(
            [*suite(), "server", "--url", url, *extra, *version, "-o", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=300,
            check=False,
        )
    results: dict[tuple[str, str], str] = {}
    for checks in out.glob("*/checks.json"):
        scenario = checks.parent.name.removeprefix("server-").rsplit("-", 6)[0]
        for c in json.loads(checks.read_text()):
            results[(scenario, c["id"])] = c["status"]
    return results


def server_scenarios(era: str) -> set[str]:
    """The suite's server scenarios of ``era`` (extensions excluded), as ``run list`` names them."""
    out = subprocess.run([*suite(), "list"], capture_output=True, text=True, timeout=120, check=False).stdout
    section = out.split("Client scenarios", 1)[0]
    return {line.split()[1] for line in section.splitlines() if line.strip().startswith("- ") and era in line}


def floor(
    report: Report, label: str, got: dict[tuple[str, str], str], minimum: int, scenarios: set[str] | None = None
) -> None:
    """Fail the run unless at least ``minimum`` checks passed in ``got`` and every scenario of ``scenarios``
    ran (gave at least one check): a crashed suite or a regressed server must not pass on fewer checks."""
    ran = {scenario for scenario, _ in got}
    for scenario in sorted((scenarios or set()) - ran):
        report.lost.append(f"{label} {scenario}: no checks ran (the suite lists it)")
    passed = sum(status == "SUCCESS" for status in got.values())
    if passed < minimum:
        report.lost.append(
            f"{label}: only {passed} checks passed, at least {minimum} expected "
            f"(the floor in tests/conformance/harness.py; {len(got)} ran)"
        )


def pending(scenario: str) -> str | None:
    for pattern, issue in PENDING.items():
        if scenario == pattern or (pattern.endswith("*") and scenario.startswith(pattern[:-1])):
            return issue
    return None


@dataclass
class Report:
    lost: list[str] = field(default_factory=list)
    """Checks that pass directly and fail through mcpipe (not pending)."""
    pending_lost: list[str] = field(default_factory=list)
    pending_passing: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    passed: int = 0
    total: int = 0

    def stale(self) -> list[str]:
        """Pending scenarios that passed everywhere they ran: their entries must go, so their checks count."""
        failing = {line.split(" ", 2)[2].split("/")[0] for line in self.pending_lost}
        passing = {line.split(" ", 2)[2] for line in self.pending_passing}
        return sorted(passing - failing)

    def ok(self) -> bool:
        return not self.lost and not self.tracebacks and not self.stale()


def mcpipe_command() -> list[str]:
    return [sys.executable, "-m", "mcpipe"]


def compare(
    report: Report, label: str, direct: dict[tuple[str, str], str], through: dict[tuple[str, str], str]
) -> None:
    for key, status in sorted(direct.items()):
        if status != "SUCCESS":
            continue
        report.total += 1
        got = through.get(key, "MISSING")
        issue = pending(key[0])
        if got == "SUCCESS":
            report.passed += 1
            if issue is not None and f"{label} {key[0]}" not in report.pending_passing:
                report.pending_passing.append(f"{label} {key[0]}")
        elif issue is not None:
            report.pending_lost.append(f"{label} {key[0]}/{key[1]}: {got} (issue {issue})")
        else:
            report.lost.append(f"{label} {key[0]}/{key[1]}: {got}")
    # a pending scenario passes only when all its checks do
    failing = {line.split("/")[0] for line in report.pending_lost}
    report.pending_passing = [p for p in report.pending_passing if p not in failing]


def run(modes: tuple[str, ...] = MODES, work: Path | None = None) -> Report:
    if work is None and os.environ.get("MCPIPE_CONFORMANCE_KEEP"):
        work = Path(os.environ["MCPIPE_CONFORMANCE_KEEP"])
        work.mkdir(parents=True, exist_ok=True)
    report = Report()
    with tempfile.TemporaryDirectory(prefix="mcpipe-conformance-") as tmp:
        base = work or Path(tmp)
        direct: dict[str, dict[tuple[str, str], str]] = {}
        if set(modes) & {"http", "stdio"}:
            with started([sys.executable, str(FIXTURE), "--http", "0"], base / "fixture.log", None) as fixture:
                for era in ERAS:
                    direct[era] = run_suite(fixture.url, era, base / f"direct-{era}")
                    floor(report, f"[direct {era}]", direct[era], DIRECT_FLOOR[era], server_scenarios(era))
                for mode in ("http", "stdio"):
                    if mode not in modes:
                        continue
                    if mode == "http":
                        server = {"url": fixture.url, "prefix": ""}
                    else:
                        # The fixture keeps no state between calls: a second process for 2025-11-25 callers
                        # lets its tools that ask them mid-call reach them (docs/interaction.md). Over stdio
                        # its test_reconnection cannot close its stream to make the client poll (SEP-1699):
                        # mcpipe does, for calls running past sse_poll_ms (that tool runs 200 ms).
                        server = {
                            "command": sys.executable,
                            "args": [str(FIXTURE)],
                            "prefix": "",
                            "session_per_era": True,
                            "sse_poll_ms": STDIO_SSE_POLL_MS,
                        }
                    config = base / f"mcpipe-{mode}.json"
                    config.write_text(json.dumps({"audit": {"enabled": False}, "mcpServers": {"everything": server}}))
                    log = base / f"mcpipe-{mode}.log"
                    args = [*mcpipe_command(), "serve", "--config", str(config), "--http", "127.0.0.1:0"]
                    with started(args, log, "serving MCP at ") as gw:
                        for era in ERAS:
                            through = run_suite(gw.url, era, base / f"{mode}-{era}")
                            compare(report, f"[{mode} {era}]", direct[era], through)
                    if (tb := Server(gw.proc, gw.url, log).traceback()) is not None:
                        report.tracebacks.append(f"mcpipe ({mode}): {tb}")
                if (tb := fixture.traceback()) is not None:
                    report.tracebacks.append(f"fixture: {tb}")
        if "alone" in modes:
            config = base / "mcpipe-alone.toml"
            config.write_text(ALONE_CONFIG)
            log = base / "mcpipe-alone.log"
            args = [*mcpipe_command(), "serve", "--config", str(config), "--http", "127.0.0.1:0"]
            with started(args, log, "serving MCP at ") as gw:
                got = run_suite(gw.url, "2025-11-25", base / "alone", ALONE)
            expected = {k: "SUCCESS" for k in got}
            for scenario in ALONE:
                if not any(k[0] == scenario for k in got):
                    report.lost.append(f"[alone] {scenario}: no checks ran")
            compare(report, "[alone 2025-11-25]", expected, got)
            floor(report, "[alone 2025-11-25]", got, ALONE_FLOOR)
            if (tb := Server(gw.proc, gw.url, log).traceback()) is not None:
                report.tracebacks.append(f"mcpipe (alone): {tb}")
        if "tasks" in modes:
            run_tasks(report, base)
        if "oauth" in modes:
            run_oauth(report, base)
    return report


OAUTH_CLIENT = HERE / "oauth_client.py"
"""mcpipe's downstream connection as the suite's client under test (``--command``)."""

NOT_TAKEN: dict[str, str] = {
    "auth/2025-03-26-oauth-metadata-backcompat": (
        "2025-03-26 only (removed in 2025-06-18): mcpipe follows the current spec, which requires protected "
        "resource metadata, and discovers nothing from a server without it"
    ),
    "auth/2025-03-26-oauth-endpoint-fallback": (
        "2025-03-26 only: guessing /authorize, /token and /register at the server's root without metadata is "
        "gone from the spec, and a gateway should not send a person's sign-in to guessed URLs"
    ),
    "auth/enterprise-managed-authorization": (
        "the identity assertion grant needs the end user's ID token from their enterprise IdP; a gateway holds "
        "its callers' access tokens, not ID tokens (mcpipe's `id_jag` credential does the exchange from those)"
    ),
    "auth/dpop": "DPoP (RFC 9449) proof-of-possession tokens are not implemented by mcpipe's client",
    "auth/dpop-nonce": "DPoP (RFC 9449) is not implemented by mcpipe's client",
    "auth/wif-jwt-bearer": (
        "workload identity federation needs a platform-issued assertion (a cloud's metadata service) that this "
        "machine has none of; mcpipe's client_credentials with private_key_jwt covers the operator-held key"
    ),
}
"""Client ``auth/*`` scenarios a gateway does not take part in, and why (docs/access.md says the same)."""

OAUTH_FLOOR = 560
"""The fewest checks mode ``oauth`` must pass (every scenario it takes, in every era it lists)."""


def oauth_scenarios() -> list[tuple[str, str | None]]:
    """``(scenario, version)`` of every client ``auth/*`` scenario, at each dated version ``run list`` gives it
    (an extension at none)."""
    out = subprocess.run([*suite(), "list"], capture_output=True, text=True, timeout=120, check=False).stdout
    section = out.split("Client scenarios", 1)[1].split("Authorization server scenarios", 1)[0]
    found: list[tuple[str, str | None]] = []
    for line in section.splitlines():
        parts = line.strip().split(maxsplit=2)
        if len(parts) < 3 or parts[0] != "-" or not parts[1].startswith("auth/"):
            continue
        versions = parts[2].strip("[]").split(",")
        if versions == ["extension"]:
            found.append((parts[1], None))
        else:  # the eras mcpipe speaks; a scenario of older versions only, at its own
            found.extend((parts[1], v) for v in [v for v in versions if v in ERAS] or versions[-1:])
    return found


def run_oauth(report: Report, base: Path) -> None:
    """Mode ``oauth``: every client ``auth/*`` scenario (each era it lists) with mcpipe's downstream connection as
    the client (``oauth_client.py``); every check must pass, but the scenarios of :data:`NOT_TAKEN`."""
    command = f"{sys.executable} {OAUTH_CLIENT}"
    got: dict[tuple[str, str], str] = {}
    taken = [(s, v) for s, v in oauth_scenarios() if s not in NOT_TAKEN]
    if not taken:
        report.lost.append("[oauth] the suite lists no auth/* client scenario")
        return
    for scenario, version in taken:
        out = base / "oauth" / f"{scenario.replace('/', '_')}-{version or 'ext'}"
        args = [*suite(), "client", "--command", command, "--scenario", scenario, "-o", str(out)]
        if version is not None:
            args += ["--spec-version", version]
        subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300, check=False)
        checks = [c for f in out.rglob("checks.json") for c in json.loads(f.read_text())]
        if not checks:
            report.lost.append(f"[oauth {version or 'extension'}] {scenario}: no checks ran")
        for i, c in enumerate(checks):  # ids repeat within a scenario (one per request checked): keep each
            got[(f"{scenario}@{version or 'extension'}", f"{c['id']}#{i}")] = c["status"]
    # INFO records what went over the wire, SKIPPED what the suite did not check: neither is a check.
    checked = {k: v for k, v in got.items() if v not in ("INFO", "SKIPPED")}
    compare(report, "[oauth]", {k: "SUCCESS" for k in checked}, checked)
    floor(report, "[oauth]", checked, OAUTH_FLOOR)


EXPECTED_TRACEBACKS = ("RuntimeError: internal failure",)
"""The fixture's ``protocol_error_job`` raises on purpose (a failed task); mcpipe logs the tool's traceback."""


def tasks_scenarios() -> list[str]:
    """The suite's ``tasks-*`` scenarios (the tasks extension), as ``run list`` names them."""
    out = subprocess.run([*suite(), "list"], capture_output=True, text=True, timeout=120, check=False).stdout
    return sorted({w for line in out.splitlines() for w in line.split() if w.startswith("tasks-")})


def run_tasks(report: Report, base: Path) -> None:
    """Mode ``tasks``: every ``tasks-*`` scenario against mcpipe serving the fixture tools on its run queue;
    every check must pass but those the suite skips itself (a scenario with no checks counts as lost)."""
    sys.path.insert(0, str(TESTS))
    from kit.tasks_fixture import CONFIG

    scenarios = tasks_scenarios()
    if not scenarios:
        report.lost.append("[tasks] the suite lists no tasks-* scenario")
        return
    config = base / "mcpipe-tasks.toml"
    config.write_text(CONFIG)
    log = base / "mcpipe-tasks.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    args = [*mcpipe_command(), "serve", "--config", str(config), "--http", "127.0.0.1:0"]
    with started(args, log, "serving MCP at ", cwd=base, env=env) as gw:
        got = run_suite(gw.url, None, base / "tasks", set(scenarios))
    for scenario in scenarios:
        if not any(k[0] == scenario for k in got):
            report.lost.append(f"[tasks] {scenario}: no checks ran")
    # A check the suite itself skips (tasks-status-notifications waits for its harness's rewrite) is no check.
    compare(report, "[tasks]", {k: "SUCCESS" for k, v in got.items() if v != "SKIPPED"}, got)
    floor(report, "[tasks]", got, TASKS_FLOOR)
    if (tb := Server(gw.proc, gw.url, log).traceback(EXPECTED_TRACEBACKS)) is not None:
        report.tracebacks.append(f"mcpipe (tasks): {tb}")


def main(argv: list[str]) -> int:
    modes = tuple(argv) or MODES
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        print(f"error: unknown mode {unknown[0]!r} (modes: {', '.join(MODES)})", file=sys.stderr)
        return 2
    runner = suite()[0]
    if not Path(runner).exists():
        print(
            f"error: the conformance suite is not at {runner} (set MCP_CONFORMANCE to its `run` script)",
            file=sys.stderr,
        )
        return 2
    t0 = time.monotonic()
    report = run(modes)
    for line in report.lost:
        print(f"LOST    {line}")
    for line in report.pending_lost:
        print(f"pending {line}")
    for scenario in report.stale():
        print(f"STALE   {scenario} passes in every mode and era: remove it from PENDING (tests/conformance/harness.py)")
    for tb in report.tracebacks:
        print(f"TRACEBACK in {tb}")
    print(
        f"{report.passed} of {report.total} checks that pass directly pass through mcpipe "
        f"({len(report.lost)} lost, {len(report.pending_lost)} pending) in {time.monotonic() - t0:.0f}s"
    )
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
