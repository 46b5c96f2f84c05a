"""The ``content`` section's Structs: the content stores a config names (:mod:`mcpipe.store.content` opens them).

Apart from :mod:`mcpipe.store.content` so that the config reads them without importing the stores.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from mcpipe._struct import Strict

__all__ = ["ContentConfig", "ContentStoreConfig"]


class ContentStoreConfig(Strict):
    """One content store (:mod:`mcpipe.store.content`)."""

    kind: Literal["memory", "file_system"] = "memory"
    root: str | None = None
    """Where a ``file_system`` store keeps its files (relative to the config's directory)."""
    max_bytes: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """The most it holds; the oldest content goes first past it (memory: 256 MiB, files: 8 GiB by default)."""


class ContentConfig(Strict):
    """Content stores: bytes pipelines store (``store_content`` steps) and clients read as resources at
    ``<scheme>://<store>/<id>`` (``docs/server.md``)."""

    stores: dict[str, ContentStoreConfig] = {}
    default: str = "default"
    """The store content goes to unless a step names another (and a URI without a store reads)."""
    scheme: str = "mcpipe-content"
    """The URI scheme content is read at."""
