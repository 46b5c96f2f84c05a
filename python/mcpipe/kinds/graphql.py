"""The ``graphql`` step kind: one GraphQL request (POST, JSON), through the ``http`` kind's guarded client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec
import orjson

from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.kinds._policy import HttpPolicy
from mcpipe.kinds.http import check_static_url, check_url, header_values, http_timeout, safe_url, send_request
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "GraphqlFields", "run_graphql"]


class GraphqlFields(StepFields, tag="graphql"):
    """One GraphQL request (POST, JSON). ``url``, ``variables`` and ``headers`` are templates;
    ``operation`` is the query text (pass data through ``variables``, never by templating the query)."""

    url: Any
    operation: Annotated[str, msgspec.Meta(min_length=1)]
    variables: Any = None
    headers: Any = None
    operation_name: str | None = None


def build_graphql(b: Build[Any]) -> HttpPolicy:
    check_static_url(b, b.templates.get("url"), f"{b.location}.url", b.policy)
    return b.policy.http


async def run_graphql(
    step: Leaf[GraphqlFields, HttpPolicy], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """One GraphQL request; the output is the response's ``data``. ``errors`` fail the step."""
    spec = step.fields
    policy = step.built
    url = check_url(inputs["url"])
    headers = header_values(inputs.get("headers")) or {}
    headers.setdefault("content-type", "application/json")
    headers.setdefault("accept", "application/graphql-response+json, application/json")
    variables = inputs.get("variables")
    if variables is not None and not isinstance(variables, Mapping):
        raise StepFailure(f"`variables` must be an object, got {type(variables).__name__}", ErrorCode.TOOL_FAILED)
    payload: dict[str, Any] = {"query": spec.operation}
    if variables is not None:
        payload["variables"] = variables
    if spec.operation_name is not None:
        payload["operationName"] = spec.operation_name
    response = await send_request(policy, "POST", url, headers=headers, content=orjson.dumps(payload))
    raw = response.body
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        text = raw[:200].decode("utf-8", errors="replace")
        raise StepFailure(
            f"HTTP {response.status} from {safe_url(url)}: not a GraphQL response: {text!r}",
            ErrorCode.TOOL_ERROR if response.status >= 400 else ErrorCode.TOOL_FAILED,
        )
    errors = answer.get("errors")
    if errors:
        messages = "; ".join(
            e.get("message", str(e)) if isinstance(e, dict) else str(e)
            for e in (errors if isinstance(errors, list) else [errors])
        )
        raise StepFailure(f"GraphQL errors: {messages}", ErrorCode.TOOL_ERROR, answer)
    if response.status >= 400:
        raise StepFailure(f"HTTP {response.status} from {safe_url(url)}", ErrorCode.TOOL_ERROR, answer)
    return StepOutput.of(answer.get("data"))


KIND = Kind(
    "graphql",
    GraphqlFields,
    run_graphql,
    templates=("url", "variables", "headers"),
    build=build_graphql,
    default_timeout=http_timeout,
)
