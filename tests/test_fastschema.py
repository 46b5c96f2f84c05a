"""The fast schema check never accepts what jsonschema rejects (property tests), and takes the
common schemas."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from mcpipe._fastschema import compile_fast

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object"},
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 10},
            "x": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1.5},
            "s": {"type": "string", "minLength": 1, "maxLength": 3, "pattern": "^a"},
            "e": {"enum": ["a", 1, None, True, 2.5]},
            "c": {"const": 0},
            "t": {"type": ["string", "null"]},
            "b": {"type": "boolean"},
            "l": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
            "o": {
                "type": "object",
                "properties": {"k": {"type": "string"}},
                "additionalProperties": {"type": "integer"},
            },
        },
        "required": ["n"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "object", "required": ["a"], "properties": {"a": {"minimum": 1}}}},
    {"type": "object", "additionalProperties": {"type": "number"}, "description": "map of numbers"},
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-20, 20)
    | st.floats(-5, 5, allow_nan=False)
    | st.sampled_from(["", "a", "ab", "abcd", "ba", "k"]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["n", "x", "s", "e", "c", "t", "b", "l", "o", "k", "a", "z"]), children, max_size=5
        )
    ),
    max_leaves=12,
)


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
@settings(max_examples=400, deadline=None)
@given(instance=json_values)
def test_the_fast_check_never_accepts_what_jsonschema_rejects(schema, instance):
    fast = compile_fast(schema)
    assert fast is not None
    if fast(instance):
        assert Draft202012Validator(schema).is_valid(instance), instance


def test_the_common_valid_arguments_take_the_fast_path():
    fast = compile_fast(SCHEMAS[1])
    assert fast is not None
    good = {"n": 3, "x": 0.5, "s": "ab", "e": None, "c": 0, "t": "x", "b": False, "l": [1], "o": {"k": "v", "z": 2}}
    assert fast(good) and fast({"n": 0})
    assert not fast({"n": 1.0})  # an integer to JSON Schema: left to jsonschema, which accepts it
    assert Draft202012Validator(SCHEMAS[1]).is_valid({"n": 1.0})


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}},
        {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
        {"type": "object", "patternProperties": {"^x": {}}},
        {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"},
        {"enum": [[1, 2]]},
    ],
)
def test_schemas_outside_the_subset_go_to_jsonschema(schema):
    assert compile_fast(schema) is None


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
@settings(max_examples=300, deadline=None)
@given(instance=json_values)
def test_a_validator_with_the_fast_check_in_front_reports_what_jsonschema_reports(schema, instance):
    from mcpipe._jsonschema import Checked, validator

    checked = validator(schema)
    assert isinstance(checked, Checked)
    plain = Draft202012Validator(schema)
    assert [e.message for e in checked.iter_errors(instance)] == [e.message for e in plain.iter_errors(instance)]
    assert checked.is_valid(instance) == plain.is_valid(instance)


def test_a_downstream_tools_valid_structured_output_is_not_walked_by_jsonschema():
    # A proxied call's outputSchema check: the common valid answer never reaches jsonschema's walk.
    from mcpipe._jsonschema import validator

    checked = validator({"type": "object", "properties": {"result": {"type": "string"}}, "required": ["result"]})
    walked: list[object] = []

    class Walked:
        def __init__(self, real: Any) -> None:
            self.real = real

        def iter_errors(self, instance: object) -> Any:
            walked.append(instance)
            return self.real.iter_errors(instance)

    checked.checker = Walked(checked.checker)
    assert list(checked.iter_errors({"result": "hi"})) == [] and walked == []
    assert [e.message for e in checked.iter_errors({"result": 1})] == ["1 is not of type 'string'"]
    assert walked == [{"result": 1}]
