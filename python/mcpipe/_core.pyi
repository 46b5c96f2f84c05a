"""mcpipe's Rust core: templates compiled once, resolved many times.

The template language is the one of the pipeline contract (``spec/pipeline.md`` section 4) and is
described for users in ``docs/references.md``.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, final

__all__ = [
    "ArrayCap",
    "Regex",
    "Template",
    "__version__",
    "fork_server_loop",
    "http1_head",
    "json_measure",
    "sys_drop_capabilities",
    "sys_mount",
    "sys_prctl",
    "sys_sched_runtime",
    "sys_setns",
    "sys_unshare",
]

__version__: str

@final
class Template:
    """A JSON template compiled once into a plan, resolved many times against environments.

    All parsing happens here: ``{"$ref": path}`` objects, ``{"$literal": value}`` objects, and strings
    with ``${path}``, ``{{stepN.path}}``, ``{{id.path}}``, ``$<path>`` and ``<<...>>`` placeholders
    (``\\${`` and friends escape an opener). A string that is exactly one placeholder resolves to the
    value with its type; otherwise each placeholder is written as text (a string as itself, null as
    ``""``, booleans as ``true``/``false``, numbers and containers as compact JSON). Object keys are
    never interpolated.

    Instances are immutable and hold their own copy of every constant, so changing ``value`` after
    compiling changes nothing.

    Args:
        value: any JSON-like value (dict, list, tuple, str, int, float, bool, None); anything else is
            a constant, passed through as it is.
        step_ids: the ids of the steps of the current list, to map ``{{stepN}}`` to ``steps.<id>``:
            either a sequence (the first id is step 1) or a mapping ``{N: id}``. A position past the end
            of a (non-empty) sequence is a syntax error, unless ``stepN`` is itself one of its ids; with a
            mapping, a position with no id stays ``stepN``.
        location: where the template is, prefixed to every error location (``"steps[2].args"``).
        max_text_bytes: the most one resolve may produce, in bytes of JSON (default 16 MiB): its interpolated
            texts and the values its typed references copy, together. Each is measured before it is built
            or copied; a resolve that would pass the bound raises
            :class:`~mcpipe.errors.OutputTooLargeError` instead.
        item: another name of the ``item`` root (a ``for_each``'s ``as``): ``${page.url}`` reads
            ``item.url`` (and references and messages write it ``item``).
        url: the value is a URL template: a string's placeholders after its literal ``://`` (without one:
            all but one opening the string) resolve percent-encoded as URL components (UTF-8, only
            ``A-Z a-z 0-9 - _ . ~`` kept), so a value stays one path segment or query value
            (``mcpipe._url``). A string that is one placeholder resolves as usual.

    Raises:
        mcpipe.errors.TemplateSyntaxError: a placeholder, path, ``$ref`` or root that does not parse;
            its ``location`` names the string, its ``reason`` says what is wrong and where.
        TypeError: ``step_ids`` that are not integers mapped to strings.
    """

    def __new__(
        cls,
        value: Any,
        *,
        step_ids: Sequence[str] | Mapping[int, str] | None = None,
        location: str = "",
        max_text_bytes: int = ...,
        item: str | None = None,
        url: bool = False,
    ) -> Template: ...
    def resolve(self, env: Mapping[str, Any]) -> Any:
        """Resolve the template against ``env`` into a fresh value.

        Dicts and lists in the result are always new objects (tuples become lists), sharing nothing
        with the template or with ``env``, so the result can be changed freely; strings, numbers and
        other immutable values may be shared.

        Args:
            env: the roots references start from: ``vars``, ``steps``, ``last``, ``args``, ``context``
                (contract section 3). It must not change while a resolve runs.

        Returns:
            The resolved value.

        Raises:
            mcpipe.errors.InterpolationError: a reference whose value is missing; it carries the
                ``reference``, the ``location``, the ``segment`` that failed and what was found there
                (``found_type``, ``found_keys``, ``found_length``).
            mcpipe.errors.OutputTooLargeError: a text or copied value that would take the resolve past
                ``max_text_bytes`` (measured before it is built), located at its reference.
            MemoryError: the allocator refused the room for an interpolated text (never an abort).
            TypeError: a value that is not JSON-serializable interpolated into text (as ``json.dumps``).
            RecursionError: a value nested too deeply (or cyclic) to copy.
        """

    @property
    def references(self) -> list[str]:
        """The normalized references the template makes, in template order (duplicates kept).

        ``{{step1.x}}`` with step 1 named ``search`` lists as ``steps.search.output.x``; quoted keys
        that read as plain keys lose their quotes (``vars['a']`` is ``vars.a``).
        """

    @property
    def reference_sites(self) -> list[tuple[str, str]]:
        """``(location, reference)`` for every reference, in template order."""

    @property
    def url_base(self) -> str | None:
        """A URL template's literal text before its first percent-encoded placeholder, when only literal
        text comes before it (what no value can change); None otherwise."""

    @property
    def is_constant(self) -> bool:
        """True when the template makes no reference: every resolve gives an equal value."""

@final
class Regex:
    """A regular expression matched in time linear in the text, whatever the pattern (the ``regex`` crate: an
    automaton, never backtracking), for JSON Schema's ``pattern`` and ``patternProperties``.

    Args:
        pattern: the pattern.

    Raises:
        ValueError: a pattern the engine does not take: lookaround or backreferences (no linear-time
            algorithm exists for them), a syntax error, or a program past 2 MiB once compiled
            (``a{1000}{1000}``); the message says which.
    """

    def __new__(cls, pattern: str) -> Regex: ...
    def search(self, text: str) -> bool:
        """Whether the pattern matches somewhere in ``text`` (as ``re.search``; anchor it to match the whole).

        Raises:
            UnicodeEncodeError: ``text`` holds a lone surrogate.
        """

    @property
    def pattern(self) -> str:
        """The pattern as given."""

@final
class ArrayCap:
    """A JSON-RPC answer's ``result.tools`` array cut to its first ``max_items`` elements while its bytes stream
    past, building no value (a tokenizer of strings, nesting and keys). Every byte is passed on but those of
    the elements past the cut (and the commas before them), so the output is the same JSON with a shorter
    array; bytes around the top-level object (an SSE stream's framing) pass as they are, and a message
    without ``result.tools`` passes unchanged.

    Args:
        max_items: the elements kept.
    """

    def __new__(cls, max_items: int) -> ArrayCap: ...
    def feed(self, data: bytes) -> bytes:
        """The next chunk of the stream, cut (chunks may split anything: a string, an escape, a key)."""

    @property
    def total(self) -> int:
        """How many elements the array has had so far, kept or not."""

def json_measure(value: Any, *, max_bytes: int = ..., max_depth: int = ..., wire: bool = False) -> tuple[int, int]:
    """Measure ``value`` as JSON without building anything: ``(bytes, depth)``.

    With ``wire``, ``bytes`` bounds from above what an MCP tool result carrying ``value`` as its structured
    content and again as a JSON text block holds: the compact JSON text with every escape counted (strings
    are scanned; UTF-8 written raw, integers of any size at their length) plus that text written as a JSON
    string. A string that cannot fit in what is left under ``max_bytes`` is not scanned.

    ``bytes`` estimates the compact JSON text from above (each string at the widest UTF-8 its storage allows;
    escapes not counted); ``depth`` counts nested containers (``1`` is 0, ``[1]`` 1, ``{"a": []}`` 2). The
    walk stops as soon as the size passes ``max_bytes`` or the depth passes ``max_depth`` (then the answer
    is only known to be past the limit), so it costs at most what the limits allow. It runs no Python code.
    """

def http1_head(
    data: bytes, max_head: int
) -> Literal[False] | tuple[str, bytes, str, list[tuple[bytes, bytes]], int, int, int] | None:
    """Read the HTTP/1.x request head at the start of ``data`` (the front's, ``mcpipe.server._front``).

    Returns ``None`` while the head is unfinished (and within ``max_head`` bytes); ``False`` when it is not a
    plain head (anything h11 might read otherwise or refuse: obs-fold, a bare LF, ``Transfer-Encoding``,
    ``Upgrade``, a repeated or odd ``Content-Length``, a missing or repeated ``Host``, HTTP/2's preface, a
    head longer than ``max_head``), which hypercorn's own protocol is then given; else ``(method, target,
    http_version, headers, head_len, content_length, flags)``: the method upper-cased, the target as sent,
    ``"1.0"`` or ``"1.1"``, the headers as (lower-cased name, trimmed value) pairs, the head's length with
    its empty line, the body's length, and bit 1 for a connection to close after the answer (HTTP/1.0 or
    ``Connection: close``), bit 2 for ``Expect: 100-continue``.
    """

# The sandbox's system calls (Linux; ``mcpipe._sandbox._zygote``, which loads this module by path in the fork
# server). Each raises ``OSError(errno, "what: strerror")``.

def sys_prctl(option: int, value: int) -> None:
    """``prctl(option, value, 0, 0, 0)``."""

def sys_unshare(flags: int) -> None:
    """``unshare(flags)``."""

def sys_setns(fd: int, kind: int) -> None:
    """``setns(fd, kind)``."""

def sys_mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """``mount(source, target, fstype, flags, data)``."""

def sys_drop_capabilities() -> None:
    """No capability left, effective, permitted or inheritable (``capset``)."""

def sys_sched_runtime(runtime_ns: int) -> bool:
    """This thread's time slice (``sched_setattr``'s ``sched_runtime``, Linux 6.12+) at its nice value:
    true when the kernel took it."""

def fork_server_loop(
    sock: int,
    wake: int,
    parent: int,
    tmp: str,
    uid_ok: bool,
    pidns_ok: bool,
    own_pidns: int,
    fork: Callable[[], int],
    sweep: Callable[[int | None, list[int]], object],
    remove_tree: Callable[[str], object],
) -> tuple[bytes, list[int], str, int | None, bool, bool]:
    """The sandbox's fork server loop (``rust/src/forkserver.rs``): serve the requests on ``sock`` (and the
    signals' wake-up pipe ``wake``) until the server is gone, then kill the workers, remove their directories
    and exit. Returns only in each worker it forks: ``(request, descriptors, directory, uid, in_pid_namespace,
    loops)``. Raises ``ValueError`` for a request that is not JSON, or what a callback raised."""
