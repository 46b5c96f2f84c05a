"""The one msgspec base Struct: the decoding policy every config section and spec type shares.

Every Struct a user writes (a config section, a declared step's fields, an ``mcp_pipe`` spec, a format's
own blocks) inherits :class:`Strict`, so the policy is said once: an unknown key is an error (a typo must not
be silently ignored), defaults are left out when encoded, and every field is named (``kw_only``).
"""

from __future__ import annotations

import msgspec

__all__ = ["Strict"]


class Strict(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """Unknown keys are errors, defaults are omitted when encoded, fields are keyword-only.

    msgspec passes the policy on to every subclass; mypy does not see ``kw_only`` inherited, so a subclass
    declaring a required field after a defaulted one says ``kw_only=True`` again (for the type checker only).
    """
