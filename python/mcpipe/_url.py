"""Outbound URLs whose templates a caller's values fill (``docs/reliability.md``, issue 27).

A URL template's literal text is the operator's; the values its placeholders take are data, often the
caller's. So a value placed after the scheme's ``://`` is percent-encoded as one URL component (mcpg's
``percent_encode_component``: UTF-8, only RFC 3986's unreserved ``A-Z a-z 0-9 - _ . ~`` kept): it stays one
path segment or one query value, and cannot add a ``/``, a ``?``, a ``#`` or an ``@``. A template that is one
placeholder (the whole URL is data) and a placeholder before ``://`` are left as they are.

Percent-encoding keeps ``.``, and many servers decode ``%2F`` (and ``%2e``) before they route, so a value
placed in the path that holds a dot segment once split at ``/`` or ``\\`` and decoded (``..``, ``../x``,
``%2e%2e/x``) is refused (:func:`place_value`); and :func:`check_templated_url` refuses a resolved URL whose
path holds a dot segment or that does not start with the template's literal base (its scheme, host and port,
and its path up to the first placeholder).
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote, urlsplit

__all__ = ["UrlRefused", "check_templated_url", "place_value", "url_component"]


class UrlRefused(ValueError):
    """A resolved URL that leaves its template's base, or whose path climbs with a dot segment."""


def url_component(text: str) -> str:
    """``text`` percent-encoded as one URL component (UTF-8; only the unreserved characters kept)."""
    return quote(text, safe="-_.~")


def place_value(text: str, literal_before: str) -> str | None:
    """``text`` as a placeholder after the literal text ``literal_before`` (the template's literal parts up to
    it, joined) puts it in the URL: percent-encoded once the scheme's ``://`` has been written, else None (left
    as it is).

    Raises:
        UrlRefused: a value in the path holding a dot segment.
    """
    if "://" not in literal_before:
        return None
    after = literal_before.split("://", 1)[1]
    if "/" in after and "?" not in after and "#" not in after:
        for segment in re.split(r"[/\\]", text):
            if _dot(segment):
                raise UrlRefused(
                    f"a value placed in the URL's path holds a dot segment (`{segment}`): it may not climb out "
                    "of the path it is placed in"
                )
    return url_component(text)


def _dot(segment: str) -> bool:
    """``.`` or ``..``, however many times percent-encoded (three decodings at most: more is no dot)."""
    for _ in range(3):
        if segment in (".", ".."):
            return True
        decoded = unquote(segment)
        if decoded == segment:
            return False
        segment = decoded
    return segment in (".", "..")


def check_templated_url(url: str, base: str) -> str:
    """``url`` (a template resolved) when it stays under ``base`` (the template's literal text before its first
    encoded placeholder) and its path has no dot segment.

    Raises:
        UrlRefused: it does not; the message names what.
    """
    parts = urlsplit(url)
    for segment in parts.path.split("/"):
        if _dot(segment):
            raise UrlRefused(
                f"the URL's path has a dot segment (`{segment}`): a value may not climb out of the path it is "
                "placed in"
            )
    fixed = urlsplit(base)
    if not fixed.scheme or "://" not in base:
        return url
    if parts.scheme.lower() != fixed.scheme.lower():
        raise UrlRefused(f"the URL's scheme is not the template's ({fixed.scheme})")
    rest = base.split("://", 1)[1]
    if "/" not in rest and "?" not in rest and "#" not in rest:
        return url  # the template's text ends inside the host: only the scheme is fixed
    if parts.netloc.lower() != fixed.netloc.lower():
        raise UrlRefused(f"the URL's host is not the template's ({fixed.netloc})")
    if "?" in rest or "#" in rest:
        return url  # the placeholders are in the query or the fragment: the path is the template's own
    directory = fixed.path.rsplit("/", 1)[0] + "/"
    if not (parts.path + "/").startswith(directory):
        raise UrlRefused(f"the URL's path leaves the template's base ({directory})")
    return url
