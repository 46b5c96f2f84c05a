"""The ``workflow`` section of the config: the model to ask and the HTTP tools it may choose from."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import httpx2
import msgspec

from mcpipe._struct import Strict

__all__ = ["AuthParam", "HttpToolConfig", "ParamDoc", "WorkflowConfig"]

Name = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
Scalar = str | int | float | bool


class ParamDoc(Strict):
    """A parameter the model fills in: its name, JSON type and what it means."""

    name: Name
    type: Literal["string", "integer", "number", "boolean"] = "string"
    description: str = ""


class AuthParam(Strict):
    """A secret the server adds to the request, never shown to the model or the caller.

    Attributes:
        env: the environment variable holding it (read at each call).
        in_: ``query`` (a query parameter) or ``header``.
        prefix: put before the value (``"Bearer "``).
    """

    env: Annotated[str, msgspec.Meta(min_length=1)]
    in_: Literal["query", "header"] = msgspec.field(default="query", name="in")
    prefix: str = ""


class HttpToolConfig(Strict):
    """One HTTP API the workflow's model may call.

    Attributes:
        name: its id (what ``tool_ids`` name).
        description: what it does, for the model.
        base_url: scheme, host and port (and a base path): ``https://www.alphavantage.co``.
        path: the endpoint under ``base_url``; ``{name}`` is one path segment the model fills in.
        method: the HTTP method; the model cannot change it.
        required_params, optional_params: what the model fills in (query parameters, or body fields for
            POST, PUT and PATCH).
        static_params: query parameters with fixed values (the model's values for them are replaced).
        authenticated_params: secrets the server adds (the model never sees or sets them).
        headers: fixed request headers.
        output_schema: what the API answers, for the model (a JSON Schema object).
    """

    name: Name
    description: str
    base_url: str
    path: str = ""
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "GET"
    required_params: list[ParamDoc] = []
    optional_params: list[ParamDoc] = []
    static_params: dict[str, Scalar] = {}
    authenticated_params: dict[str, AuthParam] = {}
    headers: dict[str, str] = {}
    output_schema: dict[str, Any] | None = None

    @property
    def endpoint(self) -> str:
        return self.base_url.rstrip("/") + "/" + self.path.lstrip("/") if self.path else self.base_url.rstrip("/")

    def path_pattern(self) -> re.Pattern[str]:
        """The full URL path this tool accepts, ``{name}`` standing for one non-empty segment (a group, in the
        order of :meth:`path_names`)."""
        path = httpx2.URL(self.endpoint).path
        parts = re.split(r"(\{[A-Za-z_][A-Za-z0-9_]*\})", path)
        regex = "".join("([^/?#]+)" if p.startswith("{") and p.endswith("}") else re.escape(p) for p in parts)
        return re.compile(regex + r"/?\Z")

    def path_names(self) -> list[str]:
        """The names of the path parameters, in order."""
        return re.findall(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", httpx2.URL(self.endpoint).path)


class WorkflowConfig(Strict):
    """The ``workflow`` section.

    Attributes:
        enabled: serve the ``workflow`` tool (and ``POST /workflow``).
        model: the model that selects the tool and writes the request: a ``[models.NAME]`` preset, or
            ``sampling`` (the calling client's model).
        format_model: the model that formats the answer (default: ``model``).
        tools: the HTTP tools.
        allow_private: let tools reach private addresses (a tool on ``localhost``); an IP literal base URL
            is allowed without it.
        verify: TLS verification: true, false, or a CA bundle path.
        timeout_ms: the deadline of the API request.
        max_response_bytes: a larger API answer fails the call.
        max_context_chars: the most tool documentation one request may put before the model.
        max_instructions_chars: the longest ``user_instructions`` accepted.
    """

    enabled: bool = True
    model: str = "sampling"
    format_model: str | None = None
    tools: list[HttpToolConfig] = []
    allow_private: bool = False
    verify: bool | str = True
    timeout_ms: Annotated[float, msgspec.Meta(gt=0)] = 30_000
    max_response_bytes: Annotated[int, msgspec.Meta(gt=0)] = 1024 * 1024
    max_context_chars: Annotated[int, msgspec.Meta(gt=0)] = 50_000
    max_instructions_chars: Annotated[int, msgspec.Meta(gt=0)] = 20_000
