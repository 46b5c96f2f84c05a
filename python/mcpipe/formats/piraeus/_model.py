"""piraeus's tool configs, prompts and flows, read from its exported JSON as its models define them.

The shapes are piraeus's own (fjfletch/piraeus, ``backend/src/dynamic_tools/models/``):

- a tool is a ``ToolConfig`` (``tool_config.py``): ``name``, ``description``, ``version``, ``enabled``,
  ``api {base_url, path, method, headers, params, auth {method, key_name, secret_ref}, timeout}``,
  ``input_schema``, ``output_schema``, ``mapping {input_to_params, input_to_body, response_to_output,
  response_path}``, ``tags``, ``metadata``; its database row (``Tool`` of ``database_models.py``, ``ToolDB`` of
  the older ``database.py``) holds it in ``tool_config``, beside ``id``, ``name`` and ``description``;
- a prompt is a row of ``prompts`` (``Prompt``/``PromptDB``): ``prompt_template`` (or the builder's
  ``content``) with ``{variable}`` placeholders, and ``variables``: ``PromptVariable`` objects ``{name, type,
  required, default, description}`` or, in the newer schema, bare names;
- a flow is a row of ``flows`` (``FlowDB``): numbered ``steps`` ``{step, type, name, inputs, description}`` of
  type ``prompt``, ``tool`` or ``service``, whose ``inputs`` reference the flow's input and earlier steps as
  ``${step_N_output}`` / ``${step_N_output.field}`` (the references ``FlowConstructorService`` resolves).

A file holds one of them, a list of them (the API's list answers), ``{tools|prompts|flows: [...], total}``
(the older list answers) or a whole project (``/api/projects/{id}/full``: ``ProjectWithData``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

import httpx2

from mcpipe._describe import did_you_mean, json_type
from mcpipe.formats.piraeus._read import MISSING, Reader, coerce, join

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "AUTH_METHODS",
    "HTTP_METHODS",
    "Api",
    "Auth",
    "FieldMapping",
    "Flow",
    "FlowStep",
    "Kind",
    "Prompt",
    "Ref",
    "ToolConfig",
    "Variable",
    "items_of",
    "read_flow",
    "read_prompt",
    "read_tool",
]

Kind = Literal["tools", "prompts", "flows"]

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
"""``HttpMethod`` (``enums.py``)."""
AUTH_METHODS = ("none", "api_key_header", "api_key_query", "bearer", "oauth2")
"""``AuthMethod`` (``enums.py``)."""
VARIABLE_TYPES = ("string", "number", "integer", "boolean", "array", "object")
STEP_TYPES = ("prompt", "tool", "service")

_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_DB_NAME = re.compile(r"[A-Za-z0-9_-]+")  # the validators of database.py: letters, digits, _ and -
_SECRET = re.compile(r"\$\{([^{}]*)\}")
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
_REF = re.compile(r"\$\{([^{}.]+)(?:\.([^{}]*))?\}")
_STEP_OUTPUT = re.compile(r"step_(\d+)_output")

_ROW_KEYS = ("id", "numeric_id", "project_id", "created_at", "updated_at")
_TOOL_ROW_KEYS = (
    *_ROW_KEYS,
    "name",
    "description",
    "tool_config",
    "method",
    "url",
    "headers",
    "query_params",
    "body_config",
)
_PROMPT_KEYS = (*_ROW_KEYS, "name", "description", "prompt_template", "content", "variables")
_FLOW_KEYS = (*_ROW_KEYS, "name", "description", "steps", "steps_array")


@dataclass(frozen=True, slots=True)
class Auth:
    """``AuthConfig``: how the API's secret is sent (``method``), under which name, and where it comes from
    (``secret_ref``: ``${NAME}`` names a secret; anything else is the secret itself)."""

    method: str = "none"
    key_name: str | None = None
    secret_ref: str | None = None

    @property
    def secret_name(self) -> str | None:
        """``NAME`` of a ``${NAME}`` reference, else None (a literal secret)."""
        m = _SECRET.fullmatch(self.secret_ref or "")
        return m.group(1) if m else None

    @property
    def where(self) -> tuple[str, str, str] | None:
        """``(query|header, name, prefix)`` of the credential, as ``GenericApiTool`` sends it; None: none sent."""
        if self.method == "api_key_query":
            return "query", self.key_name or "apikey", ""
        if self.method == "api_key_header":
            return "header", self.key_name or "X-API-Key", ""
        if self.method == "bearer":
            return "header", "Authorization", "Bearer "
        return None  # none, and oauth2 (GenericApiTool sends nothing for it)


@dataclass(frozen=True, slots=True)
class Api:
    """``ApiConfig``."""

    base_url: str
    path: str = ""
    method: str = "GET"
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    auth: Auth = field(default_factory=Auth)
    timeout: float = 30.0

    @property
    def url(self) -> str:
        """``GenericApiTool._build_url``: the base URL and the path joined by one ``/``."""
        base = self.base_url.rstrip("/")
        path = self.path.lstrip("/")
        return f"{base}/{path}" if path else base


@dataclass(frozen=True, slots=True)
class FieldMapping:
    """``FieldMapping``: input fields to query parameters and body fields; response fields to output fields."""

    input_to_params: dict[str, str] = field(default_factory=dict)
    input_to_body: dict[str, str] = field(default_factory=dict)
    response_to_output: dict[str, str] = field(default_factory=dict)
    response_path: str | None = None


@dataclass(frozen=True, slots=True)
class ToolConfig:
    """``ToolConfig``, and where it was read (``at``: ``tools/quote.json: [0].tool_config``)."""

    name: str
    description: str
    api: Api
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    mapping: FieldMapping = field(default_factory=FieldMapping)
    version: int = 1
    enabled: bool = True
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    at: str = ""


@dataclass(frozen=True, slots=True)
class Variable:
    """``PromptVariable``: a placeholder's name, type, whether it is required and its default."""

    name: str
    type: str = "string"
    required: bool = True
    default: Any = None
    description: str | None = None


@dataclass(frozen=True, slots=True)
class Prompt:
    """A ``prompts`` row: its template (``content`` when set, else ``prompt_template``, as the database's
    ``sync_prompt_content`` trigger keeps them) and its variables."""

    name: str
    description: str | None
    template: str
    variables: tuple[Variable, ...]
    at: str = ""

    def parts(self) -> list[str | Variable]:
        """The template as text and placeholders, in order."""
        by_name = {v.name: v for v in self.variables}
        out: list[str | Variable] = []
        last = 0
        for m in _PLACEHOLDER.finditer(self.template):
            var = by_name.get(m.group(1) or m.group(2))
            if var is None:
                continue
            out += [self.template[last : m.start()], var]
            last = m.end()
        out.append(self.template[last:])
        return [p for p in out if p != ""]


@dataclass(frozen=True, slots=True)
class Ref:
    """A whole-string reference of a step's inputs: ``${head}`` or ``${head.key}`` (``key`` read as one key of
    an object, dots included, as ``FlowConstructorService._resolve_input`` reads it)."""

    head: str
    key: str | None
    text: str

    @property
    def step(self) -> int | None:
        """N of ``step_N_output`` (0: the flow's input), else None (a flow input by name)."""
        m = _STEP_OUTPUT.fullmatch(self.head)
        return int(m.group(1)) if m else None


@dataclass(frozen=True, slots=True)
class FlowStep:
    """``FlowStep``: its number, type, the prompt, tool or service it runs, and its inputs."""

    step: int
    type: str
    name: str
    inputs: dict[str, Any]
    description: str | None
    at: str


@dataclass(frozen=True, slots=True)
class Flow:
    """A ``flows`` row: its steps, in the order of their numbers."""

    name: str
    description: str | None
    steps: tuple[FlowStep, ...]
    at: str = ""


def _keys(model: type[DataclassInstance]) -> tuple[str, ...]:
    """The keys of a model's JSON: its fields, but where it was read (``at``)."""
    return tuple(f.name for f in fields(model) if f.name != "at")


_TOOL_KEYS = _keys(ToolConfig)
_API_KEYS = _keys(Api)
_AUTH_KEYS = _keys(Auth)
_MAPPING_KEYS = _keys(FieldMapping)
_VARIABLE_KEYS = _keys(Variable)
_STEP_KEYS = _keys(FlowStep)
_BELONGS = {**{k: "api" for k in _API_KEYS}, **{k: "mapping" for k in _MAPPING_KEYS}}
"""A ToolConfig's keys written at its top level that are those of its ``api`` or its ``mapping``."""


def as_ref(value: str) -> Ref | None:
    m = _REF.fullmatch(value)
    return Ref(m.group(1), m.group(2), value) if m else None


def items_of(r: Reader, data: object, kind: Kind) -> Iterator[tuple[Any, str]]:
    """The entries of a file: ``(entry, its JSON path)``. A file is one entry, a list of them, or an object
    holding them under ``kind`` (a list answer, a project export)."""
    if isinstance(data, list):
        yield from ((item, f"[{i}]") for i, item in enumerate(data))
    elif isinstance(data, dict) and isinstance(data.get(kind), list):
        yield from ((item, f"{kind}[{i}]") for i, item in enumerate(data[kind]))
    elif isinstance(data, dict):
        yield data, ""
    else:
        r.problem("", f"expected a piraeus {kind[:-1]} (an object), a list of them, or an export holding `{kind}`")


# -- tools ------------------------------------------------------------------------------------------------


def read_tool(r: Reader, entry: object, path: str) -> ToolConfig | None:
    """One tool: a ``ToolConfig``, or a row holding one in ``tool_config`` (whose ``name`` and
    ``description`` fill the config's when it has none)."""
    if not isinstance(entry, dict):
        r.problem(path, f"expected a ToolConfig or a tool row (an object), got {json_type(entry)}")
        return None
    if "api" not in entry and ("tool_config" in entry or "id" in entry):
        row = r.obj(entry, path, _TOOL_ROW_KEYS, what="a tool row")
        assert row is not None
        config = row.get("tool_config")
        at = join(path, "tool_config")
        if not isinstance(config, dict):
            if config is None and (row.get("url") or row.get("method")):
                r.problem(
                    at,
                    "is empty: a tool made of the builder's flattened fields (method, url, headers, query_params) "
                    "has no ToolConfig, no input schema and no mapping; export its tool_config",
                )
            else:
                r.problem(at, f"expected a ToolConfig object, got {json_type(config)}")
            return None
        fill = {k: row[k] for k in ("name", "description") if k not in config and isinstance(row.get(k), str)}
        return _tool_config(r, {**config, **fill}, at)
    return _tool_config(r, entry, path)


def _tool_config(r: Reader, raw: Mapping[str, object], path: str) -> ToolConfig | None:
    o = r.obj(raw, path, _TOOL_KEYS, what="a ToolConfig", belongs=_BELONGS)
    if o is None:
        return None
    before = len(r.problems)
    name = r.get(o, "name", path, "string")
    if isinstance(name, str) and not _TOOL_NAME.fullmatch(name):
        r.problem(join(path, "name"), f"`{name}` is not a tool name: 1 to 64 letters, digits, `_`, `.` or `-`")
    description = r.get(o, "description", path, "string")
    version = r.get(o, "version", path, "integer", 1)
    enabled = r.get(o, "enabled", path, "boolean", True)
    api = _api(r, o.get("api", MISSING), join(path, "api"))
    input_schema = _schema(r, o, "input_schema", path)
    output_schema = _schema(r, o, "output_schema", path)
    mapping = _mapping(r, o.get("mapping", MISSING), join(path, "mapping"))
    tags = o.get("tags")
    if tags is not None and not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        r.problem(join(path, "tags"), "expected an array of strings")
    tags = tuple(tags) if isinstance(tags, list) else ()
    metadata = r.get(o, "metadata", path, "object", {})
    if api is not None and input_schema is not None and mapping is not None:
        _check_mapping(r, input_schema, mapping, join(path, "mapping"))
    if len(r.problems) > before or api is None or input_schema is None or output_schema is None or mapping is None:
        return None
    return ToolConfig(
        name, description, api, input_schema, output_schema, mapping, version, enabled, tags, metadata, r.where(path)
    )


def _api(r: Reader, raw: object, path: str) -> Api | None:
    if raw is MISSING:
        r.problem(path, "is required")
        return None
    o = r.obj(raw, path, _API_KEYS)
    if o is None:
        return None
    base_url = r.get(o, "base_url", path, "string")
    if isinstance(base_url, str):
        _check_url(r, base_url, join(path, "base_url"))
    api_path = r.get(o, "path", path, "string", "")
    method = r.one_of(o, "method", path, HTTP_METHODS, "GET")
    headers = r.str_map(o, "headers", path)
    params = r.str_map(o, "params", path)
    auth = _auth(r, o.get("auth", MISSING), join(path, "auth"))
    timeout = r.get(o, "timeout", path, "number", 30.0)
    if isinstance(timeout, float) and not timeout > 0:
        r.problem(join(path, "timeout"), f"must be more than 0 seconds, got {timeout:g}")
    if not isinstance(base_url, str) or auth is None:
        return None
    return Api(base_url, api_path or "", method or "GET", headers, params, auth, timeout or 30.0)


def _check_url(r: Reader, url: str, path: str) -> None:
    try:
        u: httpx2.URL | None = httpx2.URL(url)
    except httpx2.InvalidURL:
        u = None
    if u is None or u.scheme not in ("http", "https") or not u.host:
        r.problem(path, f"expected an http(s) URL with a host, got {url!r}")
    elif u.userinfo:
        r.problem(path, "must not carry credentials (use `auth`)")
    elif u.query or u.fragment:
        r.problem(path, "must not carry a query or fragment (static query parameters go in `api.params`)")


def _auth(r: Reader, raw: object, path: str) -> Auth | None:
    if raw is MISSING or raw is None:
        return Auth()
    o = r.obj(raw, path, _AUTH_KEYS)
    if o is None:
        return None
    method = r.one_of(o, "method", path, AUTH_METHODS, "none")
    if method is None:
        return None
    key_name = r.get(o, "key_name", path, "string", None)
    secret_ref = r.get(o, "secret_ref", path, "string", None)
    auth = Auth(method or "none", key_name, secret_ref)
    if auth.where is not None and not secret_ref:
        r.problem(join(path, "secret_ref"), f"is required for `{auth.method}`: piraeus would send an empty credential")
    return auth


def _schema(r: Reader, o: Mapping[str, object], key: str, path: str) -> dict[str, Any] | None:
    schema = r.get(o, key, path, "object")
    if not isinstance(schema, dict):
        return None
    at = join(path, key)
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        r.problem(join(at, "properties"), f"expected an object, got {json_type(props)}")
        props = {}
    for name, prop in props.items():
        if not isinstance(prop, dict):
            r.problem(join(at, f"properties.{name}"), f"expected a schema object, got {json_type(prop)}")
    required = schema.get("required", MISSING)
    if required is not MISSING and not (isinstance(required, list) and all(isinstance(x, str) for x in required)):
        r.problem(join(at, "required"), "expected an array of property names")
    return schema


def _mapping(r: Reader, raw: object, path: str) -> FieldMapping | None:
    if raw is MISSING or raw is None:
        return FieldMapping()
    o = r.obj(raw, path, _MAPPING_KEYS)
    if o is None:
        return None
    before = len(r.problems)
    m = FieldMapping(
        r.str_map(o, "input_to_params", path),
        r.str_map(o, "input_to_body", path),
        r.str_map(o, "response_to_output", path),
        r.get(o, "response_path", path, "string", None),
    )
    return m if len(r.problems) == before else None


def _check_mapping(r: Reader, input_schema: Mapping[str, object], m: FieldMapping, path: str) -> None:
    """A mapped input field the input schema does not declare never reaches the API (piraeus's executor keeps
    only the declared fields): refused, so the mapping is not silently dead."""
    props = input_schema.get("properties")
    if not isinstance(props, dict):
        return
    for key in ("input_to_params", "input_to_body"):
        for field_name in getattr(m, key):
            if field_name not in props:
                why = f"maps `{field_name}`, which input_schema does not declare{did_you_mean(field_name, props)}"
                r.problem(join(path, f"{key}.{field_name}"), f"{why}: it would never be sent")


# -- prompts ----------------------------------------------------------------------------------------------


def read_prompt(r: Reader, entry: object, path: str) -> Prompt | None:
    """One ``prompts`` row (its template, its typed variables)."""
    o = r.obj(entry, path, _PROMPT_KEYS, what="a prompt row")
    if o is None:
        return None
    before = len(r.problems)
    name = r.get(o, "name", path, "string")
    if isinstance(name, str) and not 0 < len(name.strip()) <= 255:
        r.problem(join(path, "name"), "must be 1 to 255 characters")
    description = r.get(o, "description", path, "string", None)
    content = r.get(o, "content", path, "string", None)
    template = r.get(o, "prompt_template", path, "string", None)
    text = content if content else template
    if not text and "content" not in o and "prompt_template" not in o:
        r.problem(join(path, "prompt_template"), "is required (or `content`)")
    elif not text:
        r.problem(join(path, "prompt_template"), "is empty")
    variables = _variables(r, o.get("variables", MISSING), join(path, "variables"))
    if variables is not None and isinstance(text, str) and text:
        variables = _check_placeholders(r, text, variables, join(path, "content" if content else "prompt_template"))
    if len(r.problems) > before or variables is None or not isinstance(name, str) or not text:
        return None
    return Prompt(name.strip(), description, text, variables, r.where(path))


def _variables(r: Reader, raw: object, path: str) -> tuple[Variable, ...] | None:
    if raw is MISSING or raw is None:
        return ()
    if not isinstance(raw, list):
        r.problem(path, f"expected an array of variables, got {json_type(raw)}")
        return None
    out: dict[str, Variable] = {}
    for i, item in enumerate(raw):
        at = join(path, i)
        if isinstance(item, str):  # the newer schema: bare names (typed as strings, required)
            var: Variable | None = Variable(item)
        else:
            var = _variable(r, item, at)
        if var is None:
            continue
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var.name):
            r.problem(at if isinstance(item, str) else join(at, "name"), f"`{var.name}` is not a placeholder name")
            continue
        if var.name in out:
            r.problem(at, f"variable `{var.name}` is declared twice")
            continue
        out[var.name] = var
    return tuple(out.values())


def _variable(r: Reader, raw: object, path: str) -> Variable | None:
    o = r.obj(raw, path, _VARIABLE_KEYS, what="a variable (an object, or a name)")
    if o is None:
        return None
    before = len(r.problems)
    name = r.get(o, "name", path, "string")
    kind = r.one_of(o, "type", path, VARIABLE_TYPES)
    required = r.get(o, "required", path, "boolean", True)
    default = o.get("default")
    description = r.get(o, "description", path, "string", None)
    if len(r.problems) > before or not isinstance(name, str) or not isinstance(kind, str):
        return None
    if default is not None:
        converted, why = coerce(default, kind)
        if why is not None:
            r.problem(join(path, "default"), why)
            return None
        default = converted
    return Variable(name, kind, bool(required), default, description)


def _check_placeholders(r: Reader, text: str, variables: tuple[Variable, ...], path: str) -> tuple[Variable, ...]:
    """Placeholders (``{name}``, and ``{{name}}`` as the newer rows write them) against the variables: with
    none declared, every placeholder is a required string variable; with some, a placeholder naming none is
    a problem."""
    names = list(dict.fromkeys((m.group(1) or m.group(2)) for m in _PLACEHOLDER.finditer(text)))
    if not variables:
        return tuple(Variable(n) for n in names)
    declared = {v.name for v in variables}
    known = ", ".join(sorted(declared))
    for n in names:
        if n not in declared:
            r.problem(path, f"`{{{n}}}` names no variable{did_you_mean(n, declared)} (declared: {known})")
    return variables


# -- flows ------------------------------------------------------------------------------------------------


def read_flow(r: Reader, entry: object, path: str) -> Flow | None:
    """One ``flows`` row: numbered steps of type ``prompt``, ``tool`` or ``service``."""
    o = r.obj(entry, path, _FLOW_KEYS, what="a flow row")
    if o is None:
        return None
    before = len(r.problems)
    name = r.get(o, "name", path, "string")
    if isinstance(name, str) and not (_DB_NAME.fullmatch(name.strip()) and len(name) <= 64):
        r.problem(join(path, "name"), f"`{name}` is not a flow name: 1 to 64 letters, digits, `_` or `-`")
    description = r.get(o, "description", path, "string", None)
    raw_steps = o.get("steps", MISSING)
    at = join(path, "steps")
    steps: list[FlowStep] = []
    if raw_steps is MISSING or raw_steps is None:
        if o.get("steps_array"):
            r.problem(
                join(path, "steps_array"),
                "the v6 builder's `mcp`/`response` steps are not supported (piraeus runs only their first `mcp` "
                "step, as its workflow): give the flow numbered `steps`",
            )
        else:
            r.problem(at, "is required: numbered steps of type prompt, tool or service")
    elif isinstance(raw_steps, dict):
        r.problem(
            at, "the builder's graph (nodes and edges) is not supported: piraeus never runs it; give numbered steps"
        )
    elif not isinstance(raw_steps, list):
        r.problem(at, f"expected an array, got {json_type(raw_steps)}")
    elif not raw_steps:
        r.problem(at, "must be a non-empty array of steps")
    else:
        steps = [st for i, raw in enumerate(raw_steps) if (st := _step(r, raw, join(at, i))) is not None]
        numbers = sorted(s.step for s in steps)
        if len(steps) == len(raw_steps) and numbers != list(range(1, len(steps) + 1)):
            r.problem(at, f"step numbers must be 1 to {len(steps)}, each once, got {[s.step for s in steps]}")
    if len(r.problems) > before or not isinstance(name, str):
        return None
    return Flow(name.strip(), description, tuple(sorted(steps, key=lambda s: s.step)), r.where(path))


def _step(r: Reader, raw: object, path: str) -> FlowStep | None:
    o = r.obj(raw, path, _STEP_KEYS, what="a step")
    if o is None:
        return None
    before = len(r.problems)
    number = r.get(o, "step", path, "integer")
    if isinstance(number, int) and number < 1:
        r.problem(join(path, "step"), f"must be 1 or more, got {number}")
    kind = r.one_of(o, "type", path, STEP_TYPES)
    name = r.get(o, "name", path, "string")
    inputs = r.get(o, "inputs", path, "object", {})
    description = r.get(o, "description", path, "string", None)
    if len(r.problems) > before:
        return None
    return FlowStep(number, kind, name, inputs, description, path)
