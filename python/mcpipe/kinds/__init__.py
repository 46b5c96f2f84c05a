"""Step kinds: one module per kind, one line each in the registry below.

A kind module defines its fields (a :class:`StepFields` Struct tagged with the kind's name), its
executor, what it builds at load, and its :class:`Kind` as ``KIND``; its line in the registry makes it a
step kind of
declared pipelines, of the config's JSON Schema and of the docs. See docs/declared-pipelines.md, "How to add a
step kind".
"""

from mcpipe.kinds._base import RESERVED_KINDS, Build, BuildFailed, Kind, Registry, StepFields
from mcpipe.kinds._policy import (
    CommandPolicy,
    DuckdbPolicy,
    ForbiddenError,
    HttpPolicy,
    PythonPolicy,
    StepPolicy,
)
from mcpipe.kinds._sqltext import split_postgres

__all__ = [
    "KINDS",
    "RESERVED_KINDS",
    "Build",
    "BuildFailed",
    "CommandPolicy",
    "DuckdbPolicy",
    "ForbiddenError",
    "HttpPolicy",
    "Kind",
    "PythonPolicy",
    "Registry",
    "StepFields",
    "StepPolicy",
    "split_postgres",
]

KINDS = Registry.of_modules(
    __name__,
    [
        "tool",
        "http",
        "graphql",
        "command",
        "mock",
        "value",
        "store_content",
        "transform",
        "cel_gate",
        "plugin_transform",
        "log",
        "progress",
        # The kinds that ask the client (mcpipe.interaction): they suspend and resume in 2026-07-28.
        "elicitation",
        "sampling",
        "roots_list",
        "gather",
        # The SQL kinds (mcpipe.backends.sql), on the policy's named backends.
        "sql",
        "sql_tx",
        "sql_await",
        # Messaging and RPC (mcpipe.backends): connections shared per URL, owned by the policy's Connections.
        "nats",
        "grpc",
        "kafka",
        # Code and databases, NoETL's tool kinds (mcpipe.formats.noetl maps its playbooks onto these).
        "python",
        "duckdb",
        "postgres",
        "shell",
        # Plugin backends of mcpg (seed 003) over their services' HTTP APIs.
        "twilio",
    ],
)
"""The leaf kinds by name, in the order the docs list them (``parallel`` and ``pipe`` are containers).
Each line names a module of this package whose ``KIND`` is the kind."""
