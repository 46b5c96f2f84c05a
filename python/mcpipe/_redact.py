"""Secrets kept out of the text a caller is shown (issue 27): an endpoint's error that echoes what it was sent.

:func:`redact` replaces every occurrence of each secret in a text, as sent and in the spellings an echo takes
(percent-encoded as a form or a URL writes it, escaped inside a JSON string), with ``[redacted]``. Secrets
shorter than :data:`MIN_SECRET_CHARS` are left alone: replacing a two-letter string would mangle the text
and hide nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import quote, quote_plus

import orjson

__all__ = ["MIN_SECRET_CHARS", "REDACTED", "credential_named", "redact", "redact_bytes"]

MIN_SECRET_CHARS = 4
REDACTED = "[redacted]"


_CREDENTIAL_NAME = re.compile(r"authorization|cookie|key|token|secret|password|credential", re.IGNORECASE)


def credential_named(values: Mapping[str, str]) -> list[str]:
    """The values of ``values`` (headers, query parameters) whose names say they hold a credential."""
    return [v for k, v in values.items() if _CREDENTIAL_NAME.search(k) and v]


def _spellings(secret: str) -> set[str]:
    return {secret, quote(secret, safe=""), quote_plus(secret, safe=""), orjson.dumps(secret).decode()[1:-1]}


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with each of ``secrets`` (and its encoded spellings) replaced by ``[redacted]``."""
    spellings = {s for secret in secrets if secret and len(secret) >= MIN_SECRET_CHARS for s in _spellings(secret)}
    for spelling in sorted(spellings, key=len, reverse=True):  # the longest first: one may contain another
        if spelling in text:
            text = text.replace(spelling, REDACTED)
    return text


def redact_bytes(raw: bytes, secrets: Iterable[str | None]) -> bytes:
    """:func:`redact` of a body: ``raw`` itself when no secret is in it (then it is not decoded), else its text
    (UTF-8, undecodable bytes replaced) redacted."""
    kept = [secret for secret in secrets if secret and len(secret) >= MIN_SECRET_CHARS]
    if not any(s.encode() in raw for secret in kept for s in _spellings(secret)):
        return raw
    return redact(raw.decode("utf-8", "replace"), kept).encode()
