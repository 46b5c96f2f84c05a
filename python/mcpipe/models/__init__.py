"""Asking a language model, one way for every part of mcpipe that needs one (playbook turns, the workflow).

Two providers behind one :class:`Model` protocol:

- ``openai``: any OpenAI-compatible chat-completions endpoint (``OPENAI_BASE_URL``/``OPENAI_API_KEY``,
  overridable per preset in ``[models.NAME]``);
- ``sampling``: the calling client's model, over MCP ``sampling/createMessage``, in both protocol eras.

:func:`converse` runs one exchange: tool rounds and structured output parsed and retried on malformed
answers. See ``docs/playbooks.md`` and ``docs/workflow.md``.

Models in pipelines
-------------------

(`python/mcpipe/models/`, `formats/noetl/`, `workflow/`). One `Model` protocol asks a language model, either an
OpenAI-compatible chat-completions endpoint (httpx2, the operator's endpoint from `[models.NAME]` or the
`OPENAI_*` variables) or the calling client's model over MCP sampling (through the call's `Interaction`, so both
eras work; each question of a step has its own key and answers are kept, so a 2026-07-28 retry finds every
earlier answer again). `converse` runs one exchange: tool rounds (serial) and structured output parsed, checked
against a schema and sent back with the reason when malformed. Side effects inside a step that may be re-run on
resume (a turn's tool calls, the workflow's API request) go through `once`, which records their result with the
call's finished steps. Playbooks (seed 004) are parsed and checked in `formats/noetl/_compile.py` (every problem
located), their Jinja templates compiled once in a sandboxed environment (rendered off the event loop, bounded
while they render: `expr._jinja`), and compiled into a `CompiledSpec` of plan leaves (`resource`, `model_turn`,
`action`; actions run through their step kind's executor), so they run on the scheduler above with its events,
deadlines and cancellation. A served playbook with `background` runs on the run queue like a declared pipeline
(the worker calls it as a tool); its turns' tool calls and saved turns are written to the run's event log between
the steps' own events. The workflow (seed 002) checks the model's HTTP request against the chosen tool's endpoint
before the outbound HTTP policy sees it. See docs/playbooks.md and docs/workflow.md.

"""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

from mcpipe._describe import did_you_mean, split_msgspec_error
from mcpipe.errors import Problem
from mcpipe.models._config import DEFAULT_OPENAI_BASE_URL, SAMPLING, ModelConfig
from mcpipe.models._converse import Outcome, RunTool, converse, parse_json, schema_errors, schema_errors_async
from mcpipe.models._openai import OpenAIModel
from mcpipe.models._sampling import SamplingModel, once
from mcpipe.models._types import Message, Model, ModelError, ModelOutputError, Reply, ToolCall, ToolSpec

__all__ = [
    "DEFAULT_OPENAI_BASE_URL",
    "SAMPLING",
    "Message",
    "Model",
    "ModelConfig",
    "ModelError",
    "ModelOutputError",
    "Models",
    "OpenAIModel",
    "Outcome",
    "Reply",
    "RunTool",
    "SamplingModel",
    "ToolCall",
    "ToolSpec",
    "converse",
    "load_models",
    "located",
    "once",
    "params_problems",
    "parse_json",
    "schema_errors",
    "schema_errors_async",
]


class Models:
    """The model presets of a config, by name; ``sampling`` is always there (the caller's model).

    Args:
        presets: ``[models.NAME]`` of the config.
        environ: where API keys and ``OPENAI_BASE_URL`` are read (default ``os.environ``, at each call).
    """

    def __init__(self, presets: Mapping[str, ModelConfig] | None = None, environ: Mapping[str, str] | None = None):
        self.presets = dict(presets or {})
        self.environ = environ

    def __contains__(self, name: object) -> bool:
        return name == SAMPLING or name in self.presets

    def names(self) -> list[str]:
        return sorted({SAMPLING, *self.presets})

    def hint(self, name: str) -> str:
        return did_you_mean(name, self.names())

    def get(
        self,
        name: str,
        *,
        provider: str | None = None,
        model: str | None = None,
        params: Mapping[str, object] | None = None,
    ) -> Model:
        """The model ``name``: its preset, else a default one of ``provider`` (``openai`` reads the standard
        environment variables); ``model`` and ``params`` are laid over the preset's."""
        preset = self.presets.get(name)
        if preset is None:
            sampling = provider == "sampling" or (provider is None and name == SAMPLING)
            preset = ModelConfig(provider="sampling" if sampling else "openai")
        if model is not None:
            preset = msgspec.structs.replace(preset, model=model)
        if preset.provider == "sampling":
            return SamplingModel(name, preset, params=params)
        return OpenAIModel(
            name, preset, environ=self.environ if self.environ is not None else os.environ, params=params
        )


def located(e: msgspec.ValidationError, where: str, code: str = "INVALID_CONFIG") -> Problem:
    """A msgspec error as a Problem located under ``where``; an unknown key is located at itself, with the
    closest known key."""
    loc, text = split_msgspec_error(str(e), where)
    if text.startswith("Object contains unknown field `"):
        key = text.split("`")[1]
        return Problem(f"{loc}.{key}", code, f"unknown key `{key}`")
    return Problem(loc, code, text[0].lower() + text[1:] if text else text)


RESERVED_PARAMS = ("model", "messages", "tools", "response_format", "stream")
"""Request fields mcpipe sets itself (``stream``: answers are read whole), so ``params`` cannot."""


def params_problems(params: Mapping[str, object], where: str, code: str = "INVALID_CONFIG") -> list[Problem]:
    """``params`` may not set the fields mcpipe sets itself."""
    return [
        Problem(f"{where}.{k}", code, f"`{k}` is set by mcpipe, not in params") for k in params if k in RESERVED_PARAMS
    ]


def load_models(raw: object, location: str = "models") -> tuple[dict[str, ModelConfig], list[Problem]]:
    """Decode the config's ``models`` table, every problem located (``models.gpt.json_retries``)."""
    if raw is None:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, [Problem(location, "INVALID_CONFIG", "expected a table/object of model presets")]
    out: dict[str, ModelConfig] = {}
    problems: list[Problem] = []
    for name, entry in raw.items():
        where = f"{location}.{name}"
        try:
            preset = msgspec.convert(entry, ModelConfig, strict=True)
        except msgspec.ValidationError as e:
            problems.append(located(e, where))
            continue
        problems += params_problems(preset.params, f"{where}.params")
        out[str(name)] = preset
    return out, problems
