"""Record how mcpg's JSON libraries word their errors (`make mcpg-json-errors`): the golden
tests/formats/mcpg/golden/json-errors.json, which tests/formats/mcpg/test_json_errors.py holds mcpipe's
wording to.

- ``serde_json``: the parse error of each text of ``TEXTS`` (``serde_json::from_str::<Value>``, as mcpg's
  http and command backends parse a body or a stdout), null when it parses;
- ``jsonschema``: the errors of each instance of ``SCHEMAS`` (the ``jsonschema`` crate, as mcpg's argument
  check words them: ``<instance path>: <message>``).

The versions are mcpg's (serde_json 1.0.154, jsonschema 0.28.3): ``scripts/mcpg_oracle/json_oracle`` is a
small Rust program on them, built offline from cargo's registry (``cargo build --offline``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "formats" / "mcpg" / "golden" / "json-errors.json"

TEXTS = [
    "",
    "   ",
    "hello\n",
    "1\n2\n",
    '{"a": 1} x',
    '{"a": "abcdefghijklmnopqrstuv',
    "{a:1}",
    "[1,]",
    "[1 2]",
    "[1,",
    '{"a" 1}',
    '{"a":1,}',
    '{"a":1',
    '{"a":',
    "{",
    "[",
    "nul",
    "tru e",
    "fals",
    "-",
    "-x",
    "01",
    "1.",
    "1.e5",
    "1e",
    "1e+",
    "1ex",
    "1e400",
    "-1e400",
    "1e-400",
    "1E5",
    "1" * 400,
    "123456789012345678901234567890",
    '"\\x"',
    '"\\ud800"',
    '"\\ud800\\u0041"',
    '"\\ud800\\udc00"',
    '"\\udc00"',
    '"\\u12"',
    '"\\uZZZZ"',
    '"a\tb"',
    '"line\nbreak"',
    "NaN",
    "Infinity",
    "[]",
    "{}",
    ' {"a": [1, 2, {"b": null}]} ',
    '{"k": "v"}\n\n  oops',
    "[" * 130,
    '{"é": "ü", "x": tru}',
    "<html>error</html>",
    "null",
    "true false",
]

SCHEMAS = [
    ({"type": "object", "properties": {"title": {"type": "string", "minLength": 1}}}, {"title": ""}),
    ({"type": "object", "properties": {"title": {"type": "string", "minLength": 3}}}, {"title": "ab"}),
    ({"type": "object", "properties": {"title": {"type": "string", "maxLength": 1}}}, {"title": "ab"}),
    ({"type": "object", "required": ["a", "b"], "properties": {"a": {}, "b": {}}}, {}),
    ({"type": "object", "required": ["a"]}, {"b": 1}),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}, {"n": 0}),
    ({"type": "object", "properties": {"n": {"type": "integer", "maximum": 10}}}, {"n": 11}),
    ({"type": "object", "properties": {"n": {"type": "number", "exclusiveMinimum": 0}}}, {"n": 0}),
    ({"type": "object", "properties": {"n": {"type": "number", "exclusiveMaximum": 1.5}}}, {"n": 2.5}),
    ({"type": "object", "properties": {"n": {"type": "integer"}}}, {"n": "x"}),
    ({"type": "object", "properties": {"n": {"type": ["integer", "null"]}}}, {"n": "x"}),
    ({"type": "object", "properties": {"e": {"enum": ["A", "B"]}}}, {"e": "C"}),
    ({"type": "object", "properties": {"c": {"const": "x"}}}, {"c": "y"}),
    ({"type": "object", "properties": {"p": {"type": "string", "pattern": "^a+$"}}}, {"p": "b"}),
    (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
        {"a": 1, "z": 2, "y": 3},
    ),
    ({"type": "object", "properties": {}, "additionalProperties": False}, {"z": 2}),
    ({"type": "object", "properties": {"l": {"type": "array", "minItems": 2}}}, {"l": [1]}),
    ({"type": "object", "properties": {"l": {"type": "array", "maxItems": 1}}}, {"l": [1, 2]}),
    ({"type": "object", "properties": {"l": {"type": "array", "uniqueItems": True}}}, {"l": [1, 1]}),
    ({"type": "object", "properties": {"m": {"multipleOf": 3}}}, {"m": 4}),
    ({"type": "object", "properties": {"o": {"type": "object", "minProperties": 1}}}, {"o": {}}),
    ({"type": "object", "properties": {"o": {"type": "object", "maxProperties": 1}}}, {"o": {"a": 1, "b": 2}}),
    ({"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}, {"x": []}),
    ({"type": "object", "properties": {"x": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}, {"x": []}),
    ({"type": "object", "properties": {"x": {"not": {"type": "string"}}}}, {"x": "s"}),
    (
        {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}}},
        {"a": {"b": "x"}},
    ),
    ({"type": "object", "properties": {"l": {"type": "array", "items": {"type": "integer"}}}}, {"l": [1, "x"]}),
    ({"type": "object", "properties": {"a/b": {"type": "integer"}}}, {"a/b": "x"}),
    (
        {"type": "object", "required": ["z"], "properties": {"a": {"type": "integer"}, "b": {"minLength": 2}}},
        {"a": "x", "b": "y"},
    ),
    ({"type": "object"}, []),
    ({"type": "object", "properties": {"s": {"type": "string", "format": "email"}}}, {"s": "no"}),
]


def main() -> None:
    target = ROOT / ".mcpg" / "json-oracle"
    target.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CARGO_TARGET_DIR=str(target / "target"))
    source = Path(__file__).with_name("json_oracle")
    subprocess.run(["cargo", "build", "--offline"], cwd=source, env=env, check=True)
    shutil.rmtree(source / "target", ignore_errors=True)
    lines = [json.dumps({"json": t}) for t in TEXTS]
    lines += [json.dumps({"schema": s, "instance": i}) for s, i in SCHEMAS]
    out = subprocess.run(
        [str(target / "target" / "debug" / "json-oracle")],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    answers = [json.loads(line) for line in out]
    golden = {
        "serde_json": [{"text": t, "error": a} for t, a in zip(TEXTS, answers[: len(TEXTS)], strict=True)],
        "jsonschema": [
            {"schema": s, "instance": i, "errors": a} for (s, i), a in zip(SCHEMAS, answers[len(TEXTS) :], strict=True)
        ],
    }
    GOLDEN.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    print(f"json-errors: {len(TEXTS)} texts, {len(SCHEMAS)} schemas -> {GOLDEN.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
