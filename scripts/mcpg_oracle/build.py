"""Build mcpg (the real gateway) from source into `.mcpg/`, as the oracle of tests/formats/mcpg.

`make mcpg-oracle MCPG_SRC=... MCPG_DEPS=...` runs this. Nothing is fetched from the network but crates
from crates.io. mcpg's source and its sibling crates are checked out beforehand (they are not on
crates.io: mcpg's Cargo.toml names them as git dependencies of github.com/mcpg-dev/*):

- ``MCPG_SRC``: a checkout of mcpg-dev/mcpg (v0.1.0-beta.16, 291b7f7);
- ``MCPG_DEPS``: a folder holding one checkout per sibling repository, named as the repository
  (``mcpg-plugin-host``, ``mcpg-plugin-protocol``, ..., ``mcpg-plugin-backend-http``, ...), each at
  the tag mcpg's manifests name (see docs/formats/mcpg.md, "Evidence").

The patches, all applied to copies under ``.mcpg/build/`` (the checkouts are left as they are):

1. every ``{ git = "https://github.com/mcpg-dev/NAME", tag = ..., version = ... }`` dependency, in
   mcpg's manifest and in every sibling's, becomes ``{ path = ".mcpg/build/deps/NAME" }``;
2. mcpg's ``[dev-dependencies]`` are dropped (the test-only plugin crates, criterion, wiremock...), and
   so are its two optional features that pull crates not needed here (``cp-attached``,
   ``s3-content-store``) with their optional dependencies;
3. one binary is added to mcpg's package: ``mcpg-config-check`` (``scripts/mcpg_oracle/config_check.rs``,
   ours), which prints mcpg's verdict on config files;
4. the plugins mcpg loads at run time (the backends http, mock, command, sql, nats, kafka, grpc, and the
   JSONata transform of ``plugin_transform`` steps) are built as cdylibs with their ``cdylib-export``
   feature, in the same cargo workspace;
5. one fix (``HTTP_PROFILES``): as released, the gateway never registers the per-binding profile of a
   top-level ``kind: http`` binding with the http plugin (its generic registration pass skips the kinds
   ``binding_plugin_kind`` calls gateway-native, ``http`` among them, and the static block that did it is
   ``#[cfg(test)]``), so every http tool answers ``isError: true`` "http request failed: no execution
   profile registered for '<binding>'". The pass is made to skip ``pipeline`` only (pipeline *steps* of
   kind http were already registered by the step pass). ``--no-fix`` builds without it;
6. the same for pipeline steps (``HTTP_STEPS``): the step pass reads a step's kind through
   ``binding_kind_and_spec``, which is ``None`` for http, and so refuses to boot any config with a
   ``kind: http`` pipeline step ("pipeline step '<id>' in binding '<b>' has no register-profile spec
   mapping"); it reads the step's own kind instead;
7. one more (``WATCH_DUPLICATE``): the sql plugin's cdylib carries two watch strategies
   (``sql_polling``, ``postgres_listen_notify``), but mcpg-plugin-host's ``NativeWatchStrategyAdapter``
   always takes the library's *first* watch vtable, so the second entity registers ``sql_polling`` again
   and the boot fails ("watch-strategy kind 'sql_polling' already registered (new plugin id:
   'dev.mcpg.watch.sql_polling')"): no config with a sql binding boots. The duplicate is skipped;
8. and (``SQL_SPEC``): the gateway adds ``allow_private_backends`` to every dynamic binding's spec ("the
   rest ignore the extra field"), but the sql plugin's spec denies unknown fields, so every sql binding
   fails to register ("SQL binding spec: unknown field `allow_private_backends`") and the boot fails.
   The field is not added for sql;
9. and, in the copy of mcpg-plugin-host (``BACKEND_PROFILE``): a cdylib backend's manifest profile
   (``pipeline_capable``, ``dynamic_list``, its health probe: declared with ``declare_plugin!`` and
   decoded onto the library's manifest at load) is lost, since ``NativeBackendAdapter`` registers the
   plugin's own ``manifest()``, which carries none; so mcpg refuses every backend step of a pipeline
   ("uses backend kind 'mock', which does not declare `pipeline_capable` in its manifest backend
   profile") and lists no sql resources. The adapter falls back to the library's profile.

Results: ``.mcpg/bin/mcpg``, ``.mcpg/bin/mcpg-config-check``, ``.mcpg/plugins/<kind>/plugin.so`` (and
its ``plugin.yaml``), ``.mcpg/BUILD.json`` (commits, durations).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GIT_DEP = re.compile(
    r'git\s*=\s*"https://github\.com/mcpg-dev/(?P<name>[\w.-]+?)(?:\.git)?"'
    r'(?:\s*,\s*(?:tag|branch|rev)\s*=\s*"[^"]*")?'
    r'(?:\s*,\s*version\s*=\s*"[^"]*")?'
)
# The backend plugins the oracle serves with (binding kind -> repository).
PLUGINS = {
    "http": "mcpg-plugin-backend-http",
    "mock": "mcpg-plugin-backend-mock",
    "command": "mcpg-plugin-backend-command",
    "sql": "mcpg-plugin-backend-sql",
    "nats": "mcpg-plugin-backend-nats",
    "grpc": "mcpg-plugin-backend-grpc",
    "jsonata": "mcpg-plugin-transform-jsonata",  # the transform plugin of `plugin_transform` steps
    "kafka": "mcpg-plugin-backend-kafka",  # last: librdkafka builds with cmake (Debian's cmake)
}
IGNORE = shutil.ignore_patterns("target", ".git", "Cargo.lock")


def rewrite_git_deps(manifest: Path, deps: Path) -> set[str]:
    """Point every mcpg-dev git dependency of `manifest` at its copy under `deps`; return the names."""
    text = manifest.read_text()
    names: set[str] = set()

    def repl(match: re.Match[str]) -> str:
        names.add(match["name"])
        return f'path = "{deps / match["name"]}"'

    text = GIT_DEP.sub(repl, text)
    # A member or path dependency must not declare its own workspace.
    text = re.sub(r"(?ms)^\[workspace\][^\[]*", "", text)
    manifest.write_text(text)
    return names


def drop_section(text: str, header: str) -> str:
    """Remove a whole `[header]` table (up to the next table)."""
    return re.sub(rf"(?ms)^\[{re.escape(header)}\]\n.*?(?=^\[)", "", text)


def patch_mcpg_manifest(manifest: Path) -> None:
    text = manifest.read_text()
    text = drop_section(text, "dev-dependencies")
    text = re.sub(r"(?m)^(cp-attached|s3-content-store)\s*=.*\n", "", text)
    text = re.sub(r"(?m)^mcpg-(control-plane-client|plugin-storage-s3)\s*=.*\n", "", text)
    text += '\n[[bin]]\nname = "mcpg-config-check"\npath = "oracle/config_check.rs"\n'
    manifest.write_text(text)


# Patch 5: the generic per-binding registration pass, and the one line of it that is changed.
HTTP_PROFILES_MARKER = "generic per-binding profile"
HTTP_PROFILES_OLD = "let Some(kind) = crate::backends::binding_plugin_kind(&binding.backend) else {"
HTTP_PROFILES_NEW = (
    'let Some(kind) = (binding.backend.kind != "pipeline").then_some(binding.backend.kind.as_str()) else {'
)


HTTP_STEPS_OLD = re.compile(
    r"crate::backends::binding_kind_and_spec\(\s*&step_backend,\s*config\.gateway\.server\.allow_private_backends,\s*\)"
)
HTTP_STEPS_NEW = (
    "crate::backends::dynamic_register_spec(&step_backend, config.gateway.server.allow_private_backends)"
    ".map(|spec| (step_backend.kind.clone(), spec))"
)


WATCH_DUPLICATE_OLD = re.compile(
    r"(NativeWatchStrategyAdapter::new\((?:[^;]*?)\)\?;\s*)"
    r"(registry\.register_watch_strategy_with_alias\((?:[^;]*?)\)\?;)"
)


def patch_watch_duplicate(source: Path) -> None:
    text, n = WATCH_DUPLICATE_OLD.subn(
        lambda m: (
            m.group(1)
            + "if registry.watch_strategy(mcpg_plugin_protocol::WatchStrategyPlugin::kind(&adapter)).is_none() { "
            + m.group(2)
            + " }"
        ),
        source.read_text(),
    )
    if n != 1:
        raise SystemExit(f"mcpg-oracle: patch 7 expected one watch-strategy registration site, found {n}")
    source.write_text(text)


SQL_SPEC_OLD = re.compile(r"(\n(\s*)spec\.insert\(\s*\"allow_private_backends\"\.to_owned\(\),[^;]*;)")


def patch_sql_spec(source: Path) -> None:
    text, n = SQL_SPEC_OLD.subn(
        lambda m: "\n" + m.group(2) + 'if bt.kind != "sql" {' + m.group(1) + " }", source.read_text()
    )
    if n != 1:
        raise SystemExit(f"mcpg-oracle: patch 8 expected one allow_private_backends injection, found {n}")
    source.write_text(text)


BACKEND_PROFILE_OLD = re.compile(
    r"(anyhow::Error::from\(e\)\.context\(\"invalid manifest from native backend plugin\"\)\s*\}\)\?;)"
)


def patch_backend_profile(source: Path) -> None:
    fallback = (
        " let mut manifest = manifest; if manifest.backend_profile.is_none()"
        " { manifest.backend_profile = library.meta.manifest.backend_profile.clone(); }"
    )
    text, n = BACKEND_PROFILE_OLD.subn(lambda m: m.group(1) + fallback, source.read_text())
    if n != 1:
        raise SystemExit(f"mcpg-oracle: patch 9 expected one backend adapter manifest, found {n}")
    source.write_text(text)


def patch_http_profiles(source: Path) -> None:
    text = source.read_text()
    start = text.index(HTTP_PROFILES_MARKER)
    at = text.index(HTTP_PROFILES_OLD, start)
    text = text[:at] + HTTP_PROFILES_NEW + text[at + len(HTTP_PROFILES_OLD) :]
    text, n = HTTP_STEPS_OLD.subn(HTTP_STEPS_NEW, text)
    if n != 1:
        raise SystemExit(f"mcpg-oracle: patch 6 expected one pipeline-step registration site, found {n}")
    source.write_text(text)


def git_head(path: Path) -> str:
    """The commit of a checkout (or of an export carrying a ``.commit`` file)."""
    if (path / ".commit").exists():
        return (path / ".commit").read_text().strip()
    out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def prepare(src: Path, deps_src: Path, out: Path, fix: bool = True) -> Path:
    build = out / "build"
    deps = build / "deps"
    if build.exists():
        shutil.rmtree(build)
    deps.mkdir(parents=True)
    shutil.copytree(src, build / "mcpg", ignore=IGNORE)
    (build / "mcpg" / "oracle").mkdir()
    shutil.copy(Path(__file__).with_name("config_check.rs"), build / "mcpg/oracle/config_check.rs")
    patch_mcpg_manifest(build / "mcpg" / "Cargo.toml")
    if fix:
        patch_http_profiles(build / "mcpg" / "src" / "app" / "plugin_registry" / "mod.rs")
        patch_watch_duplicate(build / "mcpg" / "src" / "app" / "plugin_registry" / "entities.rs")
        patch_sql_spec(build / "mcpg" / "src" / "backends" / "routes.rs")
    wanted = rewrite_git_deps(build / "mcpg" / "Cargo.toml", deps)
    members = ["mcpg"]
    for kind, repo in PLUGINS.items():
        if not (deps_src / repo).is_dir():
            sys.exit(f"mcpg-oracle: {deps_src / repo} is missing (the {kind} backend plugin)")
        shutil.copytree(deps_src / repo, build / "plugins" / kind, ignore=IGNORE)
        wanted |= rewrite_git_deps(build / "plugins" / kind / "Cargo.toml", deps)
        members.append(f"plugins/{kind}")
    done: set[str] = set()
    while wanted - done:
        name = sorted(wanted - done)[0]
        done.add(name)
        if not (deps_src / name).is_dir():
            sys.exit(f"mcpg-oracle: {deps_src / name} is missing (a git dependency of mcpg)")
        shutil.copytree(deps_src / name, deps / name, ignore=IGNORE)
        wanted |= rewrite_git_deps(deps / name / "Cargo.toml", deps)
    if fix:
        patch_backend_profile(deps / "mcpg-plugin-host" / "src" / "native_loader.rs")
    (build / "Cargo.toml").write_text(
        '[workspace]\nresolver = "3"\nmembers = '
        + json.dumps(members)
        + "\n\n[profile.dev]\ndebug = 0\nincremental = false\n"
        '\n[profile.dev.package."*"]\nopt-level = 1\n'
    )
    (out / "DEPS.json").write_text(json.dumps({n: git_head(deps_src / n) for n in sorted(done)}, indent=1) + "\n")
    return build


def cargo(build: Path, args: list[str], target: Path, release: bool = False) -> float:
    env = dict(os.environ, CARGO_TARGET_DIR=str(target))
    started = time.monotonic()
    profile = ["--release"] if release else []
    cmd = ["nice", "-n", "19", "cargo", "build", *profile, "-j", os.environ.get("MCPG_JOBS", "2"), *args]
    print("mcpg-oracle:", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=build, env=env, check=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default=os.environ.get("MCPG_SRC"), help="mcpg checkout")
    parser.add_argument("--deps", default=os.environ.get("MCPG_DEPS"), help="sibling checkouts")
    parser.add_argument("--out", default=str(ROOT / ".mcpg"))
    parser.add_argument("--skip-prepare", action="store_true", help="reuse .mcpg/build as it is")
    parser.add_argument("--only", choices=["mcpg", "plugins"], help="build one half")
    parser.add_argument("--plugin", action="append", choices=list(PLUGINS), help="build only these plugins")
    parser.add_argument("--no-fix", action="store_true", help="leave out patch 5 (mcpg as released)")
    parser.add_argument(
        "--release", action="store_true", help="the gateway in cargo's release profile (the proxy bench's build)"
    )
    ns = parser.parse_args()
    if not ns.src or not ns.deps:
        sys.exit("mcpg-oracle: give --src/MCPG_SRC (mcpg checkout) and --deps/MCPG_DEPS (siblings)")
    src, deps_src, out = Path(ns.src).resolve(), Path(ns.deps).resolve(), Path(ns.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    build = out / "build" if ns.skip_prepare else prepare(src, deps_src, out, fix=not ns.no_fix)
    target = out / "target"
    report_path = out / "BUILD.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report["mcpg_commit"] = git_head(src)
    report["http_profiles_fix"] = HTTP_PROFILES_NEW in (build / "mcpg/src/app/plugin_registry/mod.rs").read_text()
    (out / "bin").mkdir(exist_ok=True)
    if ns.only in (None, "mcpg"):
        report["mcpg_seconds"] = round(cargo(build, ["-p", "mcpg", "--bins"], target, ns.release))
        report["mcpg_profile"] = "release" if ns.release else "dev"
        for name in ("mcpg", "mcpg-config-check"):
            shutil.copy(target / ("release" if ns.release else "debug") / name, out / "bin" / name)
    if ns.only in (None, "plugins"):
        seconds = 0.0
        failed = []
        for kind in ns.plugin or list(PLUGINS):
            pkg = PLUGINS[kind]
            try:
                seconds += cargo(build, ["-p", pkg, "--lib", "--features", "cdylib-export"], target)
            except subprocess.CalledProcessError:
                failed.append(kind)  # the cases that need it record mcpg's refusal to boot
                continue
            so = target / "debug" / f"lib{pkg.replace('-', '_')}.so"
            dest = out / "plugins" / kind
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy(so, dest / "plugin.so")
            shutil.copy(build / "plugins" / kind / "plugin.yaml", dest / "plugin.yaml")
        report["plugins_seconds"] = round(seconds) + (report.get("plugins_seconds", 0) if ns.plugin else 0)
        report["plugins_failed"] = failed
    report_path.write_text(json.dumps(report, indent=1) + "\n")
    print("mcpg-oracle: built into", out, json.dumps(report))


if __name__ == "__main__":
    main()
