"""The one way mcpipe reads YAML (configs, playbooks, ``mcpipe run FILE``): PyYAML's safe loader, with alias
expansion bounded.

A YAML alias (``*a``) stands for its anchor's whole node, and PyYAML builds that value once and shares it, so
a 1 KB "billion laughs" document (nine anchors, each a list of nine aliases to the one before) loads in
microseconds into a value that is 9^9 nodes as a tree. Whatever walks it next (checking a config, compiling
a playbook, writing JSON) walks the tree, and spins for ever or runs out of memory. So before constructing
anything, :func:`load_yaml` counts the document's nodes and the characters of its scalars as a tree (one pass
over the composed node graph, each node's expanded size computed once) and refuses it, located at the node
where the expansion passes the bound, when its aliases add more than ``max_alias_nodes`` nodes, or more than
:data:`MAX_ALIAS_CHARS` characters (a long string aliased many times), to what the text itself holds. A
recursive alias (``&a [*a]``, a value containing itself) is refused too. Ordinary documents, aliases
included, pass.

A mapping that gives a key twice (``tool: echo`` then ``tool: now``) is refused too, located at the second
key: YAML says keys are unique, and PyYAML would silently keep the last one, so a file would run ``now`` where
its author reads ``echo``. A merge key (``<<: *base``) is not a duplicate of the keys it merges.

The errors are :class:`yaml.MarkedYAMLError`\\ s, so every reader reports them as it reports a syntax error:
with the line and column.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import yaml
from yaml import Node as _Node

__all__ = [
    "MAX_ALIAS_CHARS",
    "MAX_ALIAS_NODES",
    "DuplicateKeyError",
    "YamlBoundError",
    "check_expansion",
    "check_unique_keys",
    "compose_yaml",
    "load_yaml",
]

MAX_ALIAS_NODES = 100_000
"""The most nodes a document's aliases may add to it, counted as a tree (a node reached through k aliases
counts k more times). Walking 100 000 nodes costs a checker a fraction of a second."""

MAX_ALIAS_CHARS = 16 * 1024 * 1024
"""The most characters of scalars a document's aliases may add to it, counted as a tree: what writing the
value as JSON (``tojson``, a request body) would cost beyond the text itself."""


class YamlBoundError(yaml.MarkedYAMLError):
    """A document refused before it was constructed: its aliases expand it past the bound, or one contains
    itself. ``problem_mark`` is where (the node whose expansion passes the bound)."""


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A mapping that gives a key twice. ``problem_mark`` is the second key; the message says where the first
    is."""


_MERGE = "tag:yaml.org,2002:merge"


def check_unique_keys(root: _Node) -> None:
    """Refuse a composed document in which a mapping gives a scalar key twice (``a`` and ``'a'`` are the same
    key). Each node is visited once, aliases included.

    Raises:
        DuplicateKeyError: located at the second key of the first mapping (in document order) that has one.
    """
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], _Node] = {}
            for key, _ in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE:
                    continue
                was = first.setdefault((key.tag, key.value), key)
                if was is not key:
                    line, column = was.start_mark.line + 1, was.start_mark.column + 1
                    raise DuplicateKeyError(
                        problem=f"duplicate key `{key.value}` (first at line {line}, column {column})",
                        problem_mark=key.start_mark,
                    )
        stack.extend(reversed(_children(node)))


@lru_cache(maxsize=2)
def _loader(timestamps: bool) -> type[Any]:
    base: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    if timestamps:
        return base

    class JSONLoader(base):  # type: ignore[misc,valid-type]
        """The safe loader without dates: ``2024-01-01`` stays a string, as JSON values are."""

    JSONLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in base.yaml_implicit_resolvers.items()
    }
    return JSONLoader


def _children(node: _Node) -> list[_Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def check_expansion(root: _Node, max_alias_nodes: int = MAX_ALIAS_NODES) -> None:
    """Refuse a composed document whose aliases add more than ``max_alias_nodes`` nodes or
    :data:`MAX_ALIAS_CHARS` characters, or that contains itself. Iterative, and linear in the composed graph
    (each node's expanded size is computed once).

    Raises:
        YamlBoundError: located at the first node (in a depth-first walk) whose expansion passes a bound,
            or at the node an alias to it closes a cycle in.
    """
    nodes = chars = 0
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            nodes += 1
            chars += len(node.value) if isinstance(node, yaml.ScalarNode) else 0
            stack.extend(_children(node))
    max_nodes, max_chars = nodes + max_alias_nodes, chars + MAX_ALIAS_CHARS
    size: dict[int, tuple[int, int]] = {}
    on_path: set[int] = set()
    todo: list[tuple[_Node, bool]] = [(root, False)]
    while todo:
        node, finished = todo.pop()
        key = id(node)
        if finished:
            on_path.discard(key)
            n, c = 1, len(node.value) if isinstance(node, yaml.ScalarNode) else 0
            for child in _children(node):
                cn, cc = size[id(child)]
                n, c = n + cn, c + cc
            if n > max_nodes:
                why = f"{max_nodes} nodes ({max_alias_nodes} more than the {nodes} it holds)"
            elif c > max_chars:
                why = f"{max_chars} characters of values ({MAX_ALIAS_CHARS} more than the {chars} it holds)"
            else:
                size[key] = (n, c)
                continue
            raise YamlBoundError(
                problem=f"its aliases expand the document past {why}: an alias bomb?", problem_mark=node.start_mark
            )
        if key in size:
            continue
        if key in on_path:
            raise YamlBoundError(problem="an alias refers to a node that contains it", problem_mark=node.start_mark)
        on_path.add(key)
        todo.append((node, True))
        todo.extend((c, False) for c in _children(node) if id(c) not in size)


def compose_yaml(text: str | bytes, *, max_alias_nodes: int = MAX_ALIAS_NODES) -> _Node | None:
    """The document's node graph (for locating things in it by line), checked as :func:`load_yaml` checks it.

    Raises:
        yaml.YAMLError: not YAML, or refused (:class:`YamlBoundError`, :class:`DuplicateKeyError`).
    """
    loader = _loader(True)(text)
    try:
        node = _single_node(loader)
        if node is not None:
            check_expansion(node, max_alias_nodes)
            check_unique_keys(node)
        return node
    finally:
        loader.dispose()


def load_yaml(text: str | bytes, *, timestamps: bool = True, max_alias_nodes: int = MAX_ALIAS_NODES) -> Any:
    """Load one YAML document with the safe loader (``yaml.safe_load``'s values), alias expansion bounded.

    Args:
        text: the document.
        timestamps: read unquoted dates as ``datetime`` (YAML's rule); False keeps them strings (JSON values).
        max_alias_nodes: the most nodes aliases may add, counted as a tree.

    Raises:
        yaml.YAMLError: not YAML (a :class:`yaml.MarkedYAMLError` says where), more than one document, or
            refused (:class:`YamlBoundError`, :class:`DuplicateKeyError`).
    """
    loader = _loader(timestamps)(text)
    try:
        node = _single_node(loader)
        if node is None:
            return None
        check_expansion(node, max_alias_nodes)
        check_unique_keys(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _single_node(loader: Any) -> _Node | None:
    try:
        node: _Node | None = loader.get_single_node()
    except RecursionError:  # the pure-Python composer (no libyaml) recurses per level; libyaml stops at 1000
        raise yaml.YAMLError("the document nests too deeply") from None
    return node
