"""Vendor mcpg's real config files into ``tests/formats/mcpg/upstream/`` (issue 21).

Run from the repository root, with mcpg's repository fetched (a bare git dir)::

    python scripts/vendor_mcpg.py /work/.mirror/mcpg-dev+mcpg/repo [COMMIT]

What is collected (the upstream paths are kept):

- the files: ``examples/*/config.yaml`` (and the examples' READMEs), ``examples/deployments/*``,
  ``config.example.yaml``, ``conformance/*``, ``docs/observability/sink-redirection.yaml``;
- every full config in ``docs/``: each YAML code block whose top-level keys are all roots of mcpg's
  ``AppConfig`` (``mcp``, ``gateway``, ``governance``, ...), written ``<md path>@L<line>.yaml`` and keyed
  ``<md path>#L<line>`` (the line of the block's first line);
- the inline configs of mcpg's Rust tests: each string literal of a ``#[test]`` function (or a ``const`` it
  names) that is a YAML mapping with an ``AppConfig`` root and that the test hands to an ``AppConfig``
  parser, written ``<rust path>@<test>.yaml`` and keyed ``<rust path>::<test>``; a test with several
  configs numbers the later ones (``<rust path>::<test>#2``). The license gate's tests build their
  configs with a helper (``config_with_plugins``): those are built the same way.

``INDEX.json`` maps each key to its vendored file (relative to ``upstream/``); ``REFUSED.json`` lists the
keys mcpg's own tests expect refused, with the reason and the assertion that says so.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOTS = frozenset(
    {
        "mcp",
        "governance",
        "gateway",
        "observability",
        "feature_flags",
        "debug",
        "schema_registry",
        "storage",
        "cluster",
        "credentials",
        "license",
        "plugins",
        "cloud",
        "usage_reporting",
    }
)
OUT = Path("tests/formats/mcpg/upstream")
# Test sources whose literals reach an AppConfig parser (directly, or through a helper of the file).
APPCONFIG_PARSE = re.compile(
    r"AppConfig::load_from_yaml_strs?\(|AppConfig\s*=\s*serde_yaml::from_str|serde_yaml::from_str::<AppConfig>"
    r"|AppConfig::load(?:_many|_sources)?\(|\bconfig\(|config_with_plugins\("
)
NOT_CONFIG_TESTS = {
    # Configs only fingerprinted or base64-encoded, never parsed as configs by these tests.
    "src/app/config_watch.rs",
    "src/config/source.rs",
    "src/runtime/gateway_apps.rs",
}


def git(repo: str, *args: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={repo}", *args], check=True, capture_output=True).stdout


# --- Rust -----------------------------------------------------------------------------------------


def rust_literals(src: str) -> Iterator[tuple[int, int, str]]:
    """``(start, end, value)`` of every string literal of a Rust source (comments skipped)."""
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i)
            i = n if j < 0 else j + 2
            continue
        m = re.match(r'b?r(#*)"', src[i : i + 40])
        if m and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            close = '"' + m.group(1)
            start = i + len(m.group(0))
            j = src.find(close, start)
            yield i, j + len(close), src[start:j]
            i = j + len(close)
            continue
        if c == '"':
            j, buf = i + 1, []
            while src[j] != '"':
                if src[j] == "\\":
                    e = src[j + 1]
                    if e in "ntr0":
                        buf.append({"n": "\n", "t": "\t", "r": "\r", "0": "\0"}[e])
                        j += 2
                    elif e == "\n":
                        j += 2
                        while src[j] in " \t\n\r":
                            j += 1
                    elif e == "u":
                        k = src.index("}", j)
                        buf.append(chr(int(src[j + 3 : k], 16)))
                        j = k + 1
                    elif e == "x":
                        buf.append(chr(int(src[j + 2 : j + 4], 16)))
                        j += 4
                    else:
                        buf.append(e)
                        j += 2
                else:
                    buf.append(src[j])
                    j += 1
            yield i, j + 1, "".join(buf)
            i = j + 1
            continue
        if c == "'":
            m = re.match(r"'(\\.|[^\\'])'", src[i : i + 6]) or re.match(r"'\\u\{[0-9a-fA-F]+\}'", src[i : i + 14])
            if m:
                i += len(m.group(0))
                continue
        i += 1


def rust_tests(src: str) -> Iterator[tuple[str, int, int]]:
    """``(name, body start, body end)`` of every test function."""
    masked = list(src)
    for a, b, _ in rust_literals(src):
        masked[a:b] = " " * (b - a)
    text = re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), "".join(masked))
    for m in re.finditer(r"#\[(?:tokio::)?test[^\]]*\]\s*(?:#\[[^\]]*\]\s*)*(?:pub\s+)?(?:async\s+)?fn\s+(\w+)", text):
        b = text.index("{", m.end())
        depth, k = 0, b
        while True:
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        yield m.group(1), b, k


def as_config(value: str) -> dict[str, object] | None:
    try:
        doc = yaml.safe_load(value)
    except yaml.YAMLError:
        return None
    if isinstance(doc, dict) and {str(k) for k in doc} & ROOTS:
        return doc
    return None


def license_helper_configs(body: str) -> Iterator[tuple[str, str]]:
    """The configs ``license_gate.rs``'s ``config_with_plugins(ids, license_yaml)`` builds, with the call's
    text (for the refusal check)."""
    call = re.compile(r'config_with_plugins\(\s*&\[([^\]]*)\],\s*"((?:[^"\\]|\\.)*)",?\s*\)')
    for m in call.finditer(body):
        ids = re.findall(r'"([^"]+)"', m.group(1))
        plugins = "".join(
            f"  - id: {pid}\n    class: {pid.split('.')[2] if len(pid.split('.')) > 2 else 'backend'}\n"
            "    source: { path: /tmp/x.so }\n"
            for pid in ids
        )
        extra = next(v for _, _, v in rust_literals(f'"{m.group(2)}"'))
        yield f"plugins:\n{plugins}{extra}", m.group(0)


REASONS = {
    "src/config/tests.rs::unknown_field_under_cloud_rejected": (
        "unknown field `bogus` under `cloud` (AppConfig is deny_unknown_fields)"
    ),
    "src/config/tests.rs::cloud_tier_speaks_the_licensing_vocabulary_and_still_accepts_free": (
        "`cloud.tier: plus` is not a plan of the licensing vocabulary (community, free, pro, team, enterprise)"
    ),
    "src/license_gate.rs::alias_plus_ref_is_gated_on_the_manifest_id": (
        "the license gate: plugin `dev.mcpg.identity.saml` (named by `ref`) is entitlement-gated"
        " and no license admits it"
    ),
    "src/license_gate.rs::gated_plugin_refuses_without_a_license": (
        "the license gate: plugin `dev.mcpg.payment.ucp` is entitlement-gated and no license admits it"
    ),
    "src/license_gate.rs::garbage_token_refuses_boot_even_for_free_configs_with_gated_entries": (
        "the license gate: `license.token` / `license.pubkey_pem` do not verify"
    ),
}
"""Why mcpg refuses each config its tests expect refused (read from the tests and ``src/``)."""

REFUSAL = re.compile(r"\.is_err\(\)|\.unwrap_err\(\)|\.expect_err\(")


def rust_configs(repo: str, commit: str, path: str) -> Iterator[tuple[str, str, str | None]]:
    """``(key, yaml, refusal)`` of every inline config of the tests of one Rust file; ``refusal`` is the
    assertion that expects it refused, or None."""
    src = git(repo, "show", f"{commit}:{path}").decode()
    consts = {
        m.group(1): value
        for m in re.finditer(r"const\s+(\w+)\s*:\s*&str\s*=\s*", src)
        for a, _, value in rust_literals(src[m.end() :])
        if a == 0
    }
    used_consts: set[str] = set()
    for name, b, e in rust_tests(src):
        body = src[b:e]
        if not APPCONFIG_PARSE.search(body):
            continue
        found: list[tuple[str, str | None]] = []
        if path == "src/license_gate.rs" and "config_with_plugins(" in body:
            for text, call in license_helper_configs(body):
                after = body[body.index(call) + len(call) :]
                nxt = re.search(r"config_with_plugins\(", after)
                scope = after[: nxt.start()] if nxt else after
                refusal = REFUSAL.search(scope)
                found.append((text, _assertion(scope, refusal)))
        for a, _, value in rust_literals(body):
            if re.search(r"format!\(\s*&?$", body[max(0, a - 40) : a]):
                continue  # built at run time: not a literal config
            if re.search(r"config_with_plugins\(\s*&\[[^\]]*\],\s*$", body[max(0, a - 200) : a]):
                continue  # the license part of a config the helper builds (above)
            if as_config(value) is None:
                continue
            statement_end = body.find(";", a)
            if statement_end < 0:
                statement_end = len(body)
            statement = body[a:statement_end]
            refusal = REFUSAL.search(statement)
            found.append((value, _assertion(statement, refusal)))
        for const, value in consts.items():
            if const in used_consts or not re.search(rf"\b{const}\b", body) or as_config(value) is None:
                continue
            used_consts.add(const)
            found.append((value, None))
        if len(found) == 1 and found[0][1] is None:
            # One config in the test: any refusal the test asserts is about it.
            refusal = REFUSAL.search(body)
            found[0] = (found[0][0], _assertion(body, refusal))
        for n, (text, refusal) in enumerate(found, start=1):
            yield (f"{path}::{name}" if n == 1 else f"{path}::{name}#{n}"), text, refusal


def _assertion(text: str, refusal: re.Match[str] | None) -> str | None:
    if refusal is None:
        return None
    line_start = text.rfind("\n", 0, refusal.start()) + 1
    line_end = text.find("\n", refusal.end())
    return " ".join(text[line_start : line_end if line_end > 0 else None].split())


# --- Markdown -------------------------------------------------------------------------------------


def md_blocks(text: str) -> Iterator[tuple[int, str, str]]:
    """``(line of the block's first line, language, body)`` of every fenced code block."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        start = j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence[:3]):
            j += 1
        body = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[start:j])
        yield start + 1, lang, body + "\n"
        i = j + 1


def md_configs(repo: str, commit: str, path: str) -> Iterator[tuple[str, str]]:
    text = git(repo, "show", f"{commit}:{path}").decode()
    for line, lang, body in md_blocks(text):
        if lang not in ("yaml", "yml", ""):
            continue
        try:
            doc = yaml.safe_load(body)
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict) and doc and {str(k) for k in doc} <= ROOTS:
            yield f"{path}#L{line}", body


# --- main -----------------------------------------------------------------------------------------


FILES = re.compile(
    r"examples/[^/]+/(config\.yaml|README\.md)|examples/deployments/[^/]+|examples/README\.md"
    r"|config\.example\.yaml|conformance/[^/]+|docs/observability/sink-redirection\.yaml|LICENSE"
)
NOT_CONFIGS = re.compile(r".*\.(md|json|txt|sh)$|.*/\.gitignore$|LICENSE")


def main(repo: str, commit: str = "HEAD") -> None:
    commit = git(repo, "rev-parse", commit).decode().strip()
    files = git(repo, "ls-tree", "-r", "--name-only", commit).decode().split("\n")
    index: dict[str, str] = {}
    refused: dict[str, dict[str, str]] = {}
    for path in files:
        if FILES.fullmatch(path):
            dest = OUT / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(git(repo, "show", f"{commit}:{path}"))
            if not NOT_CONFIGS.fullmatch(path):
                index[path] = path
    for path in files:
        if path.startswith("docs/") and path.endswith(".md"):
            for key, body in md_configs(repo, commit, path):
                name = key.replace("#", "@") + ".yaml"
                (OUT / name).parent.mkdir(parents=True, exist_ok=True)
                (OUT / name).write_text(body)
                index[key] = name
    for path in files:
        if not path.endswith(".rs") or path in NOT_CONFIG_TESTS:
            continue
        for key, text, refusal in rust_configs(repo, commit, path):
            name = key.replace("::", "@").replace("#", ".") + ".yaml"
            (OUT / name).parent.mkdir(parents=True, exist_ok=True)
            (OUT / name).write_text(text if text.endswith("\n") else text + "\n")
            index[key] = name
            if refusal is not None:
                refused[key] = {"assertion": refusal, "reason": REASONS.get(key, "")}
    (OUT / "INDEX.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    (OUT / "REFUSED.json").write_text(json.dumps(refused, indent=2, sort_keys=True) + "\n")
    print(f"{len(index)} configs ({len(refused)} refused by mcpg's tests) from {commit}")


if __name__ == "__main__":
    main(*sys.argv[1:])
