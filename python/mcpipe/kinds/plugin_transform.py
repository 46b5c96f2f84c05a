"""The ``plugin_transform`` step kind: a transform plugin's value is the output.

The JSONata plugin (``plugin: jsonata`` or ``dev.mcpipe.transform.jsonata``, ``config: {expression: ...}``)
is always there; an operator adds others in the policy (``StepPolicy.plugins``): objects whose
``compile(config)`` answers something with ``evaluate(env)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from mcpipe._describe import did_you_mean, json_type
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.plan import Expression, Leaf, evaluate
from mcpipe.results import StepOutput
from mcpipe.tools import ToolContext

__all__ = ["JSONATA_PLUGIN", "KIND", "PluginTransformFields", "run_plugin_transform"]

JSONATA_PLUGIN = "dev.mcpipe.transform.jsonata"
_PLUGIN_ALIASES = {
    "jsonata": JSONATA_PLUGIN,
    JSONATA_PLUGIN: JSONATA_PLUGIN,
    "dev.mcpg.transform.jsonata": JSONATA_PLUGIN,
}


class PluginTransformFields(StepFields, tag="plugin_transform"):
    """A transform plugin: ``plugin: jsonata`` (or ``dev.mcpipe.transform.jsonata``) with
    ``config: {expression: ...}``."""

    plugin: Annotated[str, msgspec.Meta(min_length=1)]
    config: dict[str, Any] = msgspec.field(default_factory=dict)


def build_plugin(b: Build[PluginTransformFields]) -> Expression:
    """The plugin's compiled form: an operator's plugin's ``compile(config)``, or a JSONata expression."""
    from mcpipe.expr import ExpressionSyntaxError, JsonataExpr

    loc = b.location
    name = b.raw.get("plugin")
    if not isinstance(name, str):
        b.fail()
    config = b.raw.get("config")
    custom = b.policy.plugins.get(name)
    if custom is not None:
        try:
            compiled: Expression = custom.compile(config)
        except (ValueError, TypeError) as e:
            b.problem(f"{loc}.config", f"plugin '{name}': {e}")
            b.fail()
        return compiled
    if _PLUGIN_ALIASES.get(name) != JSONATA_PLUGIN:
        known = ", ".join(sorted({*_PLUGIN_ALIASES, *b.policy.plugins}))
        b.problem(f"{loc}.plugin", f"unknown plugin '{name}'{did_you_mean(name, _PLUGIN_ALIASES)} ({known})")
        b.fail()
    if not isinstance(config, Mapping):
        b.problem(f"{loc}.config", "the JSONata plugin needs `config: {expression: ...}`")
        b.fail()
    for k in config:
        if k != "expression":
            b.problem(f"{loc}.config.{k}", f"unknown field `{k}` for the JSONata plugin (it takes `expression`)")
    source = config.get("expression")
    if not isinstance(source, str):
        b.problem(f"{loc}.config.expression", f"expected a JSONata expression string, got {json_type(source)}")
        b.fail()
    try:
        expr = JsonataExpr.compile(source, max_ms=b.policy.expression_max_ms)
    except ExpressionSyntaxError as e:
        b.problem(f"{loc}.config.expression", f"invalid JSONata: {e.reason}")
        b.fail()
    b.check_mentions(expr, f"{loc}.config.expression")
    return expr


async def run_plugin_transform(
    step: Leaf[PluginTransformFields, Expression],
    inputs: Mapping[str, object],
    env: Mapping[str, object],
    ctx: ToolContext,
) -> StepOutput:
    """The plugin's value over the context is the output (JSONata: the expression's value)."""
    return StepOutput.of(await evaluate(step.built, env))


KIND = Kind("plugin_transform", PluginTransformFields, run_plugin_transform, build=build_plugin)
