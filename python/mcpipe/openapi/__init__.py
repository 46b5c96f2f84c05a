"""OpenAPI documents served as tools: ``[openapi.NAME]`` (``docs/openapi.md``).

A document (OpenAPI 3.0, 3.1, or Swagger 2.0) is read with every file its ``$ref``s name (``_document``),
checked by openapi-spec-validator, and each operation made a tool (``_operations``): its name from the
``operationId`` (or method and path, or the operator's), its input schema from its parameters and request
body with ``$ref``s resolved by ``referencing`` and bundled under ``$defs`` (``_schema``), bounded. A call
(``_tool``) writes the arguments into the request the document describes, presents the security scheme's
secret from ``[credentials]`` (or the caller's own bearer), sends it through the outbound HTTP policy and
answers the response's JSON.

The config's section (``_config``) is imported at once; the rest, which loads the HTTP client and the
validators, when first named (the config is read by every command, most of which serve no document).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mcpipe.openapi._config import OpenApiAuth, OpenApiConfig, OpenApiFilter, check_openapi

if TYPE_CHECKING:
    from mcpipe.openapi._document import Document, DocumentError, read_document, spec_problems
    from mcpipe.openapi._operations import Operation, Refused, operations, tool_name
    from mcpipe.openapi._source import LoadedApi, OpenApiSource, load_openapi
    from mcpipe.openapi._tool import OpenApiTool

__all__ = [
    "Document",
    "DocumentError",
    "LoadedApi",
    "OpenApiAuth",
    "OpenApiConfig",
    "OpenApiFilter",
    "OpenApiSource",
    "OpenApiTool",
    "Operation",
    "Refused",
    "check_openapi",
    "load_openapi",
    "operations",
    "read_document",
    "spec_problems",
    "tool_name",
]

_LAZY = {
    "Document": "_document",
    "DocumentError": "_document",
    "read_document": "_document",
    "spec_problems": "_document",
    "Operation": "_operations",
    "Refused": "_operations",
    "operations": "_operations",
    "tool_name": "_operations",
    "LoadedApi": "_source",
    "OpenApiSource": "_source",
    "load_openapi": "_source",
    "OpenApiTool": "_tool",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
