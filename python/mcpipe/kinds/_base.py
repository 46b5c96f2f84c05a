"""The step-kind protocol: what a kind is, what it gets at compile time, and the registry of kinds.

A kind is one :class:`Kind` value in one module (``mcpipe/kinds/<name>.py``): its fields (a
:class:`StepFields` Struct tagged with the kind's name), which fields are templates, what it builds at
compile time, how it runs, and its default deadline. The registry (``mcpipe.kinds.KINDS``) lists them;
the declared front-end, the config's JSON Schema and the docs read it, so adding a kind is one module
plus one registry line (see docs/declared-pipelines.md, "How to add a step kind").
"""

from __future__ import annotations

import functools
import importlib
import operator
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Generic, NoReturn, TypeVar

import msgspec

from mcpipe._struct import Strict
from mcpipe._template import Template
from mcpipe.errors import ErrorCode
from mcpipe.kinds._policy import StepPolicy
from mcpipe.plan import RunFn

if TYPE_CHECKING:
    from mcpipe.expr import CelExpr

__all__ = ["RESERVED_KINDS", "Build", "BuildFailed", "Kind", "Registry", "StepFields"]

StepId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")]
TimeoutMs = Annotated[float, msgspec.Meta(gt=0, description="Deadline in milliseconds.")]
Expression = Annotated[str, msgspec.Meta(min_length=1)]

RESERVED_KINDS = ("parallel", "pipe")
"""The containers: steps of these kinds hold steps, the front-ends compile them into the plan itself."""


class StepFields(Strict, kw_only=True, tag_field="kind"):
    """The fields every step kind has; a kind's fields subclass it with ``tag="<kind name>"``.

    Attributes:
        id: unique within its list; defaults to ``step<N>`` (N the 1-based position).
        when: a CEL condition; when false the step is skipped (it shows as skipped, its output is null).
        input_transform: a CEL expression whose value replaces ``args`` for this step's templates and
            expressions.
        timeout_ms: the step's deadline; past it the step fails with ``TIMEOUT``.
    """

    id: StepId | None = None
    when: Expression | None = None
    input_transform: Expression | None = None
    timeout_ms: TimeoutMs | None = None


class BuildFailed(Exception):
    """Raised by :meth:`Build.fail`: the step does not compile (its problems are reported)."""


F = TypeVar("F", bound=StepFields)
B = TypeVar("B")


class Build(Generic[F]):
    """What a kind's ``build`` gets: the step as written, and the front-end's checks.

    Attributes:
        raw: the step as written (the fields may be wrong; read what you check from here).
        fields: the decoded fields, or None when they have problems (still check what you can).
        location: where the step is (``pipelines.charge.steps[2]``).
        policy: what the operator allows (hosts, commands, plugins).
        tools: the tool names that exist (None: not checked); with ``.call``, what tool steps call through.
        templates: the step's compiled template fields, by name.
    """

    def __init__(
        self,
        raw: Mapping[str, object],
        fields: F | None,
        location: str,
        policy: StepPolicy,
        tools: Container[str] | None,
        templates: Mapping[str, Template],
        problem: Callable[[str, str, str], None],
        mentions: Callable[[Any, str], None],
        template: Callable[[Any, str, frozenset[str]], Template | None] | None = None,
        visible: Container[str] | None = None,
    ) -> None:
        self.raw = raw
        self.fields = fields
        self.location = location
        self.policy = policy
        self.tools = tools
        self.templates = templates
        self._problem = problem
        self._mentions = mentions
        self._template = template
        self.visible = visible
        self.failed = False

    def problem(self, location: str, message: str, code: str = ErrorCode.INVALID_SPEC) -> None:
        """Report a problem; the step does not compile (the build may go on to find more)."""
        self.failed = True
        self._problem(location, message, code)

    def fail(self) -> NoReturn:
        """Stop: the step does not compile (its problems are reported, here or by the fields' decoding)."""
        self.failed = True
        raise BuildFailed

    def decoded(self) -> F:
        """The decoded fields; stops (:meth:`fail`) when they have problems (the decoding reported them)."""
        if self.fields is None:
            self.fail()
        return self.fields

    def template(self, value: object, location: str, also_visible: frozenset[str] = frozenset()) -> Template | None:
        """Compile a template the kind holds beyond its template fields (a statement's ``params``), checking
        its references; ``also_visible`` names more steps it may read (``sql_tx``'s earlier statements,
        whose references are the kind's own). None: it has problems (reported)."""
        if self._template is None:
            raise RuntimeError("this front-end compiles no templates for kinds")
        t = self._template(value, location, also_visible)
        if t is None:
            self.failed = True
        return t

    def cel(self, source: object, location: str, extra_roots: frozenset[str] = frozenset()) -> CelExpr:
        """Compile a CEL expression and check the references it makes; fails the build when it does not
        compile (reported) or ``source`` is not a string (the fields report the type). ``extra_roots``:
        variables the kind adds (``sql_await``'s ``rows``)."""
        from mcpipe.expr import CelExpr, ExpressionSyntaxError

        if not isinstance(source, str):
            self.fail()
        try:
            expr = CelExpr.compile(source, extra_roots=extra_roots)
        except ExpressionSyntaxError as e:
            self.problem(location, f"invalid CEL: {e.reason}")
            self.fail()
        self.check_mentions(expr, location)
        return expr

    def check_mentions(self, expr: object, location: str) -> None:
        """Check the references of a compiled expression (anything with ``mentions``) against the scope."""
        self._mentions(expr, location)


@dataclass(frozen=True, slots=True)
class Kind(Generic[F, B]):
    """A leaf step kind.

    Attributes:
        name: the ``kind`` value (the fields' tag).
        fields: the msgspec Struct of its fields (a :class:`StepFields` with ``tag=name``).
        run: the executor, ``async run(step, inputs, env, ctx) -> StepOutput``; ``step.fields`` is an
            ``F`` and ``step.built`` a ``B``.
        templates: the fields compiled as templates (resolved into ``inputs``; absent ones resolve to their
            defaults).
        build: what to compile beyond the templates, once, at load: ``build(b) -> B`` (a CEL program, an
            argv); problems go through ``b.problem``, ``b.fail()`` stops. None: nothing (``built`` is None).
        default_timeout: the deadline of a step that sets none, from the operator's policy.
        tool_name: the tool a step of this kind calls, for the per-caller checks (the ``tool`` kind).
        prepare: adjusts the raw fields before decoding (``http`` upper-cases ``method``).
        own_deadline: the kind applies ``timeout_ms`` itself (the plan gives the step no deadline), so that
            its ``TIMEOUT`` can say what it waited for (``sql_await``, ``nats``, ``grpc``, ``kafka``).
        url_templates: the template fields that are URLs: the values their placeholders take are
            percent-encoded as URL components (``Template(..., url=True)``, ``mcpipe._url``).
    """

    name: str
    fields: type[F]
    run: RunFn[F, B]
    templates: tuple[str, ...] = ()
    build: Callable[[Build[F]], B] | None = None
    default_timeout: Callable[[StepPolicy], float | None] | None = None
    tool_name: Callable[[F], str] | None = None
    prepare: Callable[[dict[str, Any]], None] | None = None
    own_deadline: bool = False
    url_templates: tuple[str, ...] = ()


class Registry:
    """The step kinds by name, in the order the docs list them; each kind's module imported when the kind is
    first asked for.

    The registry starts from a table of names and the modules that define them (``KIND``), so listing the
    kinds (``list(registry)``, ``name in registry``, a ``check`` error naming every kind) imports none of
    them, and a plan pays only for the kinds it uses. ``registry[name]`` and ``get(name)`` answer the
    :class:`Kind` (importing its module the first time); :meth:`kinds` and :meth:`fields_union` import every
    one. A kind registered at run time (:meth:`register`: a format's own kinds) is held as it is.
    """

    def __init__(self, kinds: list[Kind[Any, Any]] | None = None, *, modules: Mapping[str, str] | None = None) -> None:
        # name -> its Kind, or the module path that defines it (replaced by the Kind when first loaded)
        self._entries: dict[str, Kind[Any, Any] | str] = {}
        self._modules: dict[str, str] = {}
        for name, module in (modules or {}).items():
            if name in self._entries or name in RESERVED_KINDS:
                raise ValueError(f"a step kind named {name!r} already exists")
            self._entries[name] = self._modules[name] = module
        for k in kinds or ():
            self.register(k)

    @classmethod
    def of_modules(cls, modules: Mapping[str, str]) -> Registry:
        """The kinds named by ``modules`` (name -> the module whose ``KIND`` it is), in order, none imported
        yet."""
        return cls(modules=modules)

    def module_of(self, name: str) -> str | None:
        """The module that defines kind ``name`` in the registry's table (``mcpipe.kinds.python``), without
        importing it; None for a kind registered at run time."""
        if name not in self._entries:
            raise KeyError(name)
        return self._modules.get(name)

    def _load(self, name: str, module: str) -> Kind[Any, Any]:
        kind = getattr(importlib.import_module(module), "KIND", None)
        if not isinstance(kind, Kind):
            raise TypeError(f"{module} defines no KIND (a mcpipe.kinds.Kind)")
        if kind.name != name:
            raise TypeError(f"{module} defines kind {kind.name!r}, but the registry lists it as {name!r}")
        self._check_tag(kind)
        self._entries[name] = kind
        return kind

    @staticmethod
    def _check_tag(kind: Kind[Any, Any]) -> None:
        tag = kind.fields.__struct_config__.tag
        if tag != kind.name:
            raise ValueError(f"the fields of kind {kind.name!r} are tagged {tag!r}; use tag={kind.name!r}")

    def register(self, kind: Kind[Any, Any]) -> Kind[Any, Any]:
        """Add a kind (its name must be new and its fields tagged with it)."""
        if kind.name in self._entries or kind.name in RESERVED_KINDS:
            raise ValueError(f"a step kind named {kind.name!r} already exists")
        self._check_tag(kind)
        self._entries[kind.name] = kind
        return kind

    def unregister(self, name: str) -> None:
        """Remove a kind (tests that register a throwaway kind)."""
        del self._entries[name]
        self._modules.pop(name, None)

    def get(self, name: str) -> Kind[Any, Any] | None:
        entry = self._entries.get(name)
        if isinstance(entry, str):
            return self._load(name, entry)
        return entry

    def __getitem__(self, name: str) -> Kind[Any, Any]:
        kind = self.get(name)
        if kind is None:
            raise KeyError(name)
        return kind

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def loaded(self) -> list[str]:
        """The names of the kinds whose modules are imported so far (or that were registered as kinds)."""
        return [name for name, entry in self._entries.items() if not isinstance(entry, str)]

    def kinds(self) -> list[Kind[Any, Any]]:
        """The kinds, in order (every kind's module imported)."""
        return [self[name] for name in list(self._entries)]

    def fields_union(self, *extra: type[msgspec.Struct]) -> Any:
        """The tagged union of every kind's fields (and ``extra`` Structs), for decoding and JSON Schema."""
        return functools.reduce(operator.or_, [k.fields for k in self.kinds()] + list(extra))
