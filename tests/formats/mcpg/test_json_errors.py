"""mcpipe words JSON parse errors and argument refusals as mcpg's libraries do, for mcpg's configs.

The golden (``golden/json-errors.json``) was recorded from the crates mcpg links, at mcpg's versions
(``scripts/mcpg_oracle/json_errors.py``, `make mcpg-json-errors`): serde_json's parse error of each text,
and the jsonschema crate's errors of each instance as mcpg's argument check words them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from mcpipe.formats.mcpg._answers import rust_schema_errors
from mcpipe.formats.mcpg._serde_json import loads, serde_json_error

GOLDEN: dict[str, Any] = json.loads((Path(__file__).parent / "golden" / "json-errors.json").read_text())


@pytest.mark.parametrize("case", GOLDEN["serde_json"], ids=lambda c: repr(c["text"][:24]))
def test_a_json_text_fails_to_parse_where_and_as_serde_json_says(case: dict[str, Any]) -> None:
    assert serde_json_error(case["text"]) == case["error"]
    value, error = loads(case["text"])
    assert error == case["error"]
    if error is None:
        assert value == json.loads(case["text"])


@pytest.mark.parametrize("case", GOLDEN["jsonschema"], ids=lambda c: json.dumps(c["instance"])[:32])
def test_arguments_that_break_the_schema_are_worded_as_the_jsonschema_crate_words_them(case: dict[str, Any]) -> None:
    errors = list(Draft202012Validator(case["schema"]).iter_errors(case["instance"]))
    assert rust_schema_errors(errors) == case["errors"]
