"""Step kinds: one module per kind, one line each in the registry below.

A kind module defines its fields (a :class:`StepFields` Struct tagged with the kind's name), its
executor, what it builds at load, and its :class:`Kind` as ``KIND``; its line in the registry (its name
and module) makes it a step kind of declared pipelines, of the config's JSON Schema and of the docs. The
module is imported when a plan first uses the kind. See docs/declared-pipelines.md, "How to add a step kind".
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
    {
        "tool": "mcpipe.kinds.tool",
        "http": "mcpipe.kinds.http",
        "graphql": "mcpipe.kinds.graphql",
        "command": "mcpipe.kinds.command",
        "mock": "mcpipe.kinds.mock",
        "value": "mcpipe.kinds.value",
        "store_content": "mcpipe.kinds.store_content",
        "transform": "mcpipe.kinds.transform",
        "cel_gate": "mcpipe.kinds.cel_gate",
        "plugin_transform": "mcpipe.kinds.plugin_transform",
        "log": "mcpipe.kinds.log",
        "progress": "mcpipe.kinds.progress",
        # The kinds that ask the client (mcpipe.interaction): they suspend and resume in 2026-07-28.
        "elicitation": "mcpipe.kinds.elicitation",
        "sampling": "mcpipe.kinds.sampling",
        "roots_list": "mcpipe.kinds.roots_list",
        "gather": "mcpipe.kinds.gather",
        # The SQL kinds (mcpipe.backends.sql), on the policy's named backends.
        "sql": "mcpipe.kinds.sql",
        "sql_tx": "mcpipe.kinds.sql_tx",
        "sql_await": "mcpipe.kinds.sql_await",
        # Messaging and RPC (mcpipe.backends): connections shared per URL, owned by the policy's Connections.
        "nats": "mcpipe.kinds.nats",
        "grpc": "mcpipe.kinds.grpc",
        "kafka": "mcpipe.kinds.kafka",
        # Code and databases, NoETL's tool kinds (mcpipe.formats.noetl maps its playbooks onto these).
        "python": "mcpipe.kinds.python",
        "duckdb": "mcpipe.kinds.duckdb",
        "postgres": "mcpipe.kinds.postgres",
        "shell": "mcpipe.kinds.shell",
        # Plugin backends of mcpg (seed 003) over their services' HTTP APIs.
        "twilio": "mcpipe.kinds.twilio",
    }
)
"""The leaf kinds by name, in the order the docs list them (``parallel`` and ``pipe`` are containers), each
with the module whose ``KIND`` it is: a kind's module is imported when a plan first uses the kind, so a
command pays only for the kinds its input has (``tests/kinds/test_registry.py`` checks this table against
the modules' own ``KIND``, both ways)."""
