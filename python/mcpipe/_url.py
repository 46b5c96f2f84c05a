"""Outbound URLs whose templates a caller's values fill (``docs/reliability.md``, issue 27).

A URL template's literal text is the operator's; the values its placeholders take are data, often the
caller's. So a value is percent-encoded as one URL component (mcpg's ``percent_encode_component``: UTF-8,
only RFC 3986's unreserved ``A-Z a-z 0-9 - _ . ~`` kept): it stays one path segment or one query value, and
cannot add a ``/``, a ``?``, a ``#`` or an ``@``. Left as they are: a template that is one placeholder (the
whole URL is data), placeholders before the literal ``://`` (a scheme, a host), and a placeholder that opens
a template without one (a base URL given as a value). The Rust core applies the same rule to a
``Template(..., url=True)`` (mcpipe's ``http`` kind); :func:`encode_from` is it for other templates (mcpg's).

Percent-encoding keeps ``.``, and many servers decode ``%2F`` and ``%2e`` before they route, so
:func:`check_templated_url` refuses a resolved URL whose path holds a dot segment, once each segment is
decoded and split at ``/`` and ``\\`` (``..``, ``..%2Fx``, ``%2e%2e``), and one that does not start with the
template's literal base (its scheme, host and port, and its path up to the first encoded placeholder).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import quote, unquote, urlsplit

__all__ = ["UrlRefused", "check_templated_url", "encode_from", "url_component"]

_SEPARATORS = re.compile(r"[/\\]")


class UrlRefused(ValueError):
    """A resolved URL that leaves its template's base, or whose path climbs with a dot segment."""


def url_component(text: str) -> str:
    """``text`` percent-encoded as one URL component (UTF-8; only the unreserved characters kept)."""
    return quote(text, safe="-_.~")


def encode_from(parts: Sequence[str | None]) -> int:
    """The index of the first part of a URL template whose placeholders are encoded (the Rust core's rule).

    Args:
        parts: the template's parts in order: literal text, or None for a placeholder.
    """
    literal = ""
    for i, part in enumerate(parts):
        if part is not None:
            literal += part
            if "://" in literal:
                return i + 1
    return 1 if parts and parts[0] is None else 0


def _climbs(segment: str) -> bool:
    """Whether a path segment is, or decodes to text holding, a ``.`` or ``..`` segment (decoded three times
    at most: a server decoding more often is not one to send caller text to)."""
    for _ in range(4):
        if any(piece in (".", "..") for piece in _SEPARATORS.split(segment)):
            return True
        decoded = unquote(segment)
        if decoded == segment:
            return False
        segment = decoded
    return False


def check_templated_url(url: str, base: str | None) -> str:
    """``url`` (a template resolved) when its path has no dot segment and it stays under ``base`` (the
    template's literal text before its first encoded placeholder; None: no literal base).

    Raises:
        UrlRefused: it does not; the message names what.
    """
    parts = urlsplit(url)
    for segment in parts.path.split("/"):
        if _climbs(segment):
            raise UrlRefused(
                f"the URL's path holds a dot segment (`{segment}`): a value may not climb out of the path it is "
                "placed in"
            )
    if base is None or "://" not in base:
        return url
    fixed = urlsplit(base)
    if parts.scheme.lower() != fixed.scheme.lower():
        raise UrlRefused(f"the URL's scheme is not the template's ({fixed.scheme})")
    rest = base.split("://", 1)[1]
    if not re.search(r"[/?#]", rest):
        return url  # the template's text ends inside the host: only the scheme is fixed
    if parts.netloc.lower() != fixed.netloc.lower():
        raise UrlRefused(f"the URL's host is not the template's ({fixed.netloc})")
    if "?" in rest or "#" in rest:
        return url  # the placeholders are in the query or the fragment: the path is the template's own
    directory = fixed.path.rsplit("/", 1)[0] + "/"
    if not (parts.path + "/").startswith(directory):
        raise UrlRefused(f"the URL's path leaves the template's base ({directory})")
    return url
