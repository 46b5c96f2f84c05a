"""The ``gather`` step kind: ask several questions in one round."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from mcpipe._struct import Strict
from mcpipe.interaction import GATHER_KINDS, OUTPUT_OF, AskFailed, BadInput, interaction_of, question
from mcpipe.kinds._ask import failed
from mcpipe.kinds._base import Kind, StepFields
from mcpipe.plan import Leaf
from mcpipe.results import StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "GatherFields", "run_gather"]

CorrelationToken = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")]


class _GatherEntry(Strict, kw_only=True, tag_field="kind"):
    correlation_token: CorrelationToken
    skip_if_unsupported: bool = False


class GatherElicitation(_GatherEntry, tag="elicitation"):
    message: Any
    requested_schema: Any = None


class GatherSampling(_GatherEntry, tag="sampling"):
    messages: Any
    system_prompt: Any = None
    max_tokens: Any = 1024
    model_preferences: Any = None
    temperature: Any = None


class GatherRoots(_GatherEntry, tag="roots"):
    pass


class GatherFields(StepFields, tag="gather"):
    """Ask several questions in one round (``inputs``, each with a unique ``correlation_token``; the roots
    entry's kind is ``roots``). The output maps each token to its answer."""

    inputs: Annotated[list[GatherElicitation | GatherSampling | GatherRoots], msgspec.Meta(min_length=1)]
    with_text: bool = True
    """A sampling answer holds ``text``, the text of the reply's content (false: the client's result as it is)."""


async def run_gather(
    step: Leaf[GatherFields, None], inputs: dict[str, Any], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Ask several questions in one round; the output maps each entry's ``correlation_token`` to its
    answer (``{"skipped": true}`` for an entry skipped with ``skip_if_unsupported``)."""
    entries = inputs["inputs"]
    questions: list[tuple[str | None, str, dict[str, Any] | None, bool]] = []
    kinds: dict[str, str] = {}
    try:
        for i, entry in enumerate(entries):
            token = entry.get("correlation_token")
            if not isinstance(token, str) or not token:
                raise BadInput(f"`inputs[{i}].correlation_token` must be a non-empty string")
            if token in kinds:
                raise BadInput(f"`inputs[{i}].correlation_token` '{token}' is used twice")
            kind = GATHER_KINDS[entry["kind"]]
            kinds[token] = kind
            questions.append((token, kind, question(kind, entry), bool(entry.get("skip_if_unsupported", False))))
    except BadInput as e:
        raise failed(e) from None
    ix = interaction_of(ctx)
    try:
        if ix is None:
            raise AskFailed("there is no MCP client to ask (this call was not made over MCP)")
        answers = await ix.ask_many(ix.key(ctx, step.id), questions)
    except AskFailed as e:
        raise failed(e) from None
    out = {token: OUTPUT_OF[kinds[token]](answers[token]) for token in kinds}
    if not step.fields.with_text:
        for token, kind in kinds.items():
            if kind == "sampling" and isinstance(out[token], dict) and not out[token].get("skipped"):
                out[token].pop("text", None)
    return StepOutput.of(out)


KIND = Kind("gather", GatherFields, run_gather, templates=("inputs",))
