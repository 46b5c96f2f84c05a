"""OpenAPI documents served as tools: ``[openapi.NAME]`` (``docs/openapi.md``).

A document (OpenAPI 3.0, 3.1, or Swagger 2.0) is read with every file its ``$ref``s name (``_document``),
checked by openapi-spec-validator, and each operation made a tool (``_operations``): its name from the
``operationId`` (or method and path, or the operator's), its input schema from its parameters and request
body with ``$ref``s resolved by ``referencing`` and bundled under ``$defs`` (``_schema``), bounded. A call
(``_tool``) writes the arguments into the request the document describes, presents the security scheme's
secret from ``[credentials]`` (or the caller's own bearer), sends it through the outbound HTTP policy and
answers the response's JSON.
"""

from mcpipe.openapi._config import OpenApiAuth, OpenApiConfig, OpenApiFilter
from mcpipe.openapi._document import Document, DocumentError, read_document, spec_problems
from mcpipe.openapi._operations import Operation, Refused, operations, tool_name
from mcpipe.openapi._source import LoadedApi, OpenApiSource, check_openapi, load_openapi
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
