"""``MODULE:ATTR``: the one rule for naming a Python object from the command line and from a config file.

``mcpipe run --tools mytools:registry`` and ``python_tools = ["mytools:registry"]`` go through
:func:`load_object`: the module is imported with the given directories (the config file's) and the current
directory importable, then the dotted attribute is looked up in it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["LoadError", "load_object"]


class LoadError(ValueError):
    """``MODULE:ATTR`` cannot be loaded; the message is one line naming the entry and why."""


def load_object(entry: str, *, search: Sequence[str | os.PathLike[str]] = ()) -> Any:
    """Import ``MODULE`` and return its (dotted) attribute ``ATTR``.

    Args:
        entry: ``MODULE:ATTR``, e.g. ``mytools:registry`` or ``pkg.mod:holder.registry``.
        search: directories to make importable first (a config file's directory); the current directory
            is always importable (a console script does not put it on ``sys.path``; ``python -m`` does).

    Raises:
        LoadError: the entry is not ``MODULE:ATTR``, the module cannot be imported (any exception its code
            raised, named), or it has no such attribute.
    """
    module_name, sep, attr = entry.partition(":")
    if not sep or not module_name or not attr:
        raise LoadError(f"`{entry}` is not MODULE:ATTR (e.g. mytools:registry)")
    for directory in [*(os.fspath(d) for d in search), os.getcwd()]:
        if directory not in sys.path:
            sys.path.insert(0, directory)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # importing runs the module's code: any failure is the user's module's
        raise LoadError(f"cannot import `{module_name}`: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LoadError(f"module `{module_name}` has no attribute `{attr}`") from None
    return obj
