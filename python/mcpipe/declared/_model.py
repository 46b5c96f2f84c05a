"""The shape of a declared step: the containers' fields here, every leaf kind's in :mod:`mcpipe.kinds`.

A step is a flat object: ``kind``, ``id`` and the kind's fields as siblings. Every kind shares ``when``,
``input_transform`` and ``timeout_ms`` (:class:`mcpipe.kinds.StepFields`). Template fields are plain JSON
values here; the compiler turns them into :class:`mcpipe.Template` objects. Unknown fields are errors.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any

import msgspec

from mcpipe.kinds import KINDS, StepFields

__all__ = ["ParallelFields", "PipeFields", "StepFields", "kind_structs", "step_schema"]


class ParallelFields(StepFields, tag="parallel"):
    """Run ``steps`` concurrently; they see what this step's list sees, not each other."""

    steps: Annotated[list[Any], msgspec.Meta(min_length=1)]


class PipeFields(StepFields, tag="pipe"):
    """A nested pipeline: its own ``vars`` (resolved in the parent), ``steps`` and ``return``."""

    steps: Annotated[list[Any], msgspec.Meta(min_length=1)]
    vars: dict[str, Any] = msgspec.field(default_factory=dict)
    return_: Any = msgspec.field(default=msgspec.UNSET, name="return")
    continue_on_error: bool = False


CONTAINERS: dict[str, type[StepFields]] = {"parallel": ParallelFields, "pipe": PipeFields}


def kind_structs() -> dict[str, type[StepFields]]:
    """Every kind's fields by name, in the order the docs list them: the registry's, then the containers."""
    return {**{k.name: k.fields for k in KINDS.kinds()}, **CONTAINERS}


def step_schema() -> dict[str, Any]:
    """A JSON Schema of one declared step (every kind of the registry), for the config's schema and for
    editors."""
    # The union is built from the registry at run time, so it is typed Any here.
    annotated: Any = typing.Annotated
    union = annotated[
        KINDS.fields_union(ParallelFields, PipeFields),
        msgspec.Meta(description="A declared pipeline step: kind, id, and the kind's fields."),
    ]
    return msgspec.json.schema(union)
