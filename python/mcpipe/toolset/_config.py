"""The ``[tools]`` section: the operator's view of every tool: tools reshaped, originals hidden, and how a
caller discovers them (the whole list, or a search) (``docs/gateway.md``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from mcpipe._struct import Strict

__all__ = ["ArgumentShape", "ReshapeConfig", "ToolsConfig"]


_UNSET: Any = msgspec.UNSET


class ArgumentShape(Strict):
    """What the reshaped tool does with one of the original's arguments.

    Attributes:
        name: the argument's name in the reshaped tool (renamed).
        value: a fixed value: the argument is hidden from callers and always sent as this.
        default: the value sent when the caller gives none (the argument becomes optional).
        description: the argument's description in the reshaped tool.
        hide: leave the argument out (the original's own default applies; it must not be required).
    """

    name: str | None = None
    value: Any = _UNSET
    default: Any = _UNSET
    description: str | None = None
    hide: bool = False


class ReshapeConfig(Strict):
    """One reshaped tool (``[tools.reshape.NAME]``, NAME the reshaped tool's name).

    Attributes:
        tool: the original tool's name (a downstream server's, an OpenAPI operation's, a Python tool's, a declared
            pipeline's).
        title: the new title.
        description: the new description.
        arguments: per original argument, what the reshaped tool does with it.
        output: an expression projecting the original's answer: it reads the answer as ``last`` (its structured
            content, else its text) and the caller's arguments as ``args``; its value is the new answer.
        language: the language of ``output``: ``jsonata`` or ``cel``.
        annotations: MCP annotations (``readOnlyHint``, ...), laid over the original's.
        hide_original: the original is no longer listed nor callable by its own name.
    """

    tool: str
    title: str | None = None
    description: str | None = None
    arguments: dict[str, ArgumentShape] = {}
    output: str | None = None
    language: Literal["jsonata", "cel"] = "jsonata"
    annotations: dict[str, Any] = {}
    hide_original: bool = False


class ToolsConfig(Strict):
    """The ``[tools]`` section.

    Attributes:
        discovery: ``list``: ``tools/list`` shows every tool; ``search``: it shows ``search_tools``,
            ``describe_tools``, ``mcp_pipe`` and the ``pinned`` tools, and the others are found by searching
            (and called as ever).
        pinned: tools listed in search mode too (``*`` globs).
        hide: tools neither listed nor callable (``*`` globs): the ones reshaped tools stand for, say.
        search_limit: the most tools one search answers.
        reshape: the reshaped tools, by their new name.
    """

    discovery: Literal["list", "search"] = "list"
    pinned: list[str] = []
    hide: list[str] = []
    search_limit: Annotated[int, msgspec.Meta(ge=1, le=100)] = 10
    reshape: dict[str, ReshapeConfig] = {}
