"""mcpg's MCP Apps (``mcp.configurations.apps``): the policy as mcpipe's ``apps`` section, and the templated apps of
its ``registry`` compiled as mcpg compiles them (``src/config/apps.rs``, ``src/runtime/gateway_apps.rs``).

A templated app is a ``ui://mcpg/<id>`` resource: mcpg's reviewed HTML shell (``assets/gateway_apps_shell.html``,
vendored unchanged) with the app's binding injected at its ``<!--MCPG_APP_CONFIG-->`` marker as a JSON data
island (``<script type="application/json" id="mcpg-app-config">``, keys sorted as serde_json writes them, ``<``,
``>``, ``&`` and the line separators escaped); omitted columns or fields derived from the data tool's output
(input, for a form) schema; its ``_meta.ui`` authored from its ``csp``, ``permissions`` and ``prefers_border``,
then clamped by the policy. Each is served as a declared resource (``answer: mcpg.payload``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

__all__ = ["APP_MIME", "apps_section", "compile_app", "registry_problem"]

APP_MIME = "text/html;profile=mcp-app"
_SHELL = Path(__file__).with_name("assets") / "gateway_apps_shell.html"
_MARKER = "<!--MCPG_APP_CONFIG-->"
_MAX_DERIVED = 100
_PERMISSIONS = {
    "camera": "camera",
    "microphone": "microphone",
    "geolocation": "geolocation",
    "clipboard_write": "clipboardWrite",
}
_SECRET_SCHEMES = ("cred", "secret", "env", "file", "vault", "aws-sm", "aws-secrets", "gcp-sm", "azure-kv")
_APP_ID = re.compile(r"[a-z0-9][a-z0-9-]*")


def _csp_policy(apps: Mapping[str, Any]) -> dict[str, Any]:
    """The operator's ``csp_policy`` over mcpg's defaults."""
    return {
        "connect_domains": ["*"],
        "resource_domains": ["*"],
        "frame_domains": ["self"],
        "base_uri_domains": ["self"],
        "redirect_domains": ["*"],
        **(apps.get("csp_policy") or {}),
    }


def apps_section(apps: Mapping[str, Any]) -> dict[str, Any]:
    """``AppsConfig`` as mcpipe's ``apps`` section."""
    out: dict[str, Any] = {
        "enabled": True,
        "strict": bool(apps.get("strict", False)),
        "csp_policy": _csp_policy(apps),
        "allowed_permissions": [_PERMISSIONS[p] for p in apps.get("allowed_permissions", list(_PERMISSIONS))],
    }
    if apps.get("allowed_domains") is not None:
        out["allowed_domains"] = list(apps["allowed_domains"])
    return out


def _secret(value: object) -> bool:
    if isinstance(value, str):
        lower = value.lower()
        return any(f"{scheme}://" in lower for scheme in _SECRET_SCHEMES)
    if isinstance(value, Mapping):
        return any(_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(_secret(v) for v in value)
    return False


def registry_problem(apps: Mapping[str, Any]) -> tuple[str, str] | None:
    """``AppsConfig::validate``: (where, mcpg's message) when mcpg refuses the section, else None."""
    where = "mcp.configurations.apps"
    if apps.get("allowed_domains") is not None and not apps["allowed_domains"]:
        return (
            f"{where}.allowed_domains",
            "apps.allowed_domains is set but empty — this would drop EVERY _meta.ui.domain. Omit the field to "
            "allow any domain, or list the permitted origins.",
        )
    registry = list(apps.get("registry") or [])
    if not registry:
        return None
    if not apps.get("enabled"):
        return (
            f"{where}.registry",
            "apps.registry is non-empty but apps.enabled is false — set enabled: true to advertise and serve the "
            "authored apps.",
        )
    if len(registry) > 256:
        return (
            f"{where}.registry",
            f"apps.registry has {len(registry)} apps (max 256) — each compiles a resident HTML body",
        )
    seen: set[str] = set()
    for i, app in enumerate(registry):
        at = f"{where}.registry[{i}]"
        app_id = str(app.get("id", ""))
        if not _APP_ID.fullmatch(app_id):
            return f"{at}.id", f'apps.registry: invalid app id "{app_id}" — must match [a-z0-9] then [a-z0-9-]*'
        if app_id in seen:
            return f"{at}.id", f'apps.registry: duplicate app id "{app_id}"'
        seen.add(app_id)
        why = _app_problem(app)
        if why is not None:
            return at, f"apps.registry[{app_id}]: {why}"
        if apps.get("strict"):
            why = _outside_policy(app, apps)
            if why is not None:
                return at, f"apps.registry[{app_id}]: strict mode — {why}"
    return None


def _app_problem(app: Mapping[str, Any]) -> str | None:
    """``GatewayAppConfig::validate``."""
    kind = app.get("kind")
    if kind == "form" and not app.get("data_tool"):
        return "kind 'form' requires a data_tool — its inputSchema drives the form"
    if kind == "map":
        m = app.get("map")
        if not isinstance(m, Mapping):
            return "kind 'map' requires a `map:` block"
        if not (m.get("lat_field") and m.get("lng_field")) and not m.get("geojson_path"):
            return "map: needs either lat_field+lng_field or geojson_path"
        if m.get("mode") == "raster_tiles" and not m.get("tile_url"):
            return "map.mode 'raster_tiles' requires tile_url (and the host must be allowed in `csp`)"
    if app.get("map") is not None and kind != "map":
        return "a `map:` block is only valid on kind 'map'"
    if (app.get("csp") or {}).get("redirect_domains"):
        return "csp.redirect_domains has no effect on gateway-authored apps — remove it"
    primary = app.get("primary_action")
    if primary is not None and not any(a.get("id") == primary for a in app.get("row_actions") or []):
        return f'primary_action "{primary}" does not match any row_actions[].id'
    names = [t.get("name") for t in app.get("app_tools") or []]
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        return f'duplicate app_tools name "{dup}"'
    if _secret({k: v for k, v in app.items() if k != "public_values"}):
        return (
            "a secret reference (cred://, vault://, env://, …) is not allowed in binding/app fields — secrets "
            "belong in public_values (with allow_credential_values: true)"
        )
    if not app.get("allow_credential_values"):
        for k, v in (app.get("public_values") or {}).items():
            if _secret(v):
                return f"public_values.{k}: a secret reference requires allow_credential_values: true"
    return None


def _outside_policy(app: Mapping[str, Any], apps: Mapping[str, Any]) -> str | None:
    policy = _csp_policy(apps)
    csp = app.get("csp") or {}
    for name in ("connect_domains", "resource_domains", "frame_domains"):
        declared, allowed = list(csp.get(name) or []), list(policy.get(name) or [])
        if "*" not in allowed and not all(d in allowed for d in declared):
            return f"csp.{name} declares domains outside the operator csp_policy.{name} allow-list"
    allowed_perms = list(apps.get("allowed_permissions", list(_PERMISSIONS)))
    for perm in app.get("permissions") or []:
        if perm not in allowed_perms:
            return f"permission {_debug_perm(perm)} is outside apps.allowed_permissions"
    return None


def _debug_perm(perm: str) -> str:
    return "".join(part.capitalize() for part in str(perm).split("_"))


# --- compiling an app -------------------------------------------------------------------------------


def _window_config(app: Mapping[str, Any], io: Mapping[str, object] | None) -> dict[str, Any]:
    """``build_window_config``: the app's config as serde writes it (its defaults, its empty lists left out),
    without the credential surface, with ``schema_version`` and the introspected columns or fields."""
    v: dict[str, Any] = {k: val for k, val in app.items() if val is not None and val != [] and val != {}}
    v.pop("allow_credential_values", None)
    pv = {k: val for k, val in (v.get("public_values") or {}).items() if not _secret(val)}
    if pv:
        v["public_values"] = pv
    else:
        v.pop("public_values", None)
    if isinstance(v.get("columns"), list):
        v["columns"] = [{"format": "text", **c} for c in v["columns"]]
    if isinstance(v.get("map"), Mapping):
        v["map"] = {"mode": "plot", **v["map"]}
    v["schema_version"] = 1
    kind, output, inputs = app.get("kind"), (io or {}).get("output"), (io or {}).get("input")
    derived: tuple[str, list[dict[str, Any]]] | None = None
    if kind in ("table", "list", "selection", "chart") and output:
        derived = "columns", _derive_columns(output, app.get("rows_path"))
    elif kind in ("detail", "key_value") and output:
        derived = "fields", _derive_fields(output, True)
    elif kind == "form" and inputs:
        derived = "fields", _derive_fields(inputs, False)
    if derived is not None and app.get(derived[0]) is None and derived[1]:
        v[derived[0]] = derived[1]
    if isinstance(v.get("app_tools"), list):
        v["app_tools"] = [{**t, "name": f"app.{app['id']}.{t['name']}"} for t in v["app_tools"]]
    return v


def _type_is(schema: object, wanted: str) -> bool:
    t = schema.get("type") if isinstance(schema, Mapping) else None
    return t == wanted or (isinstance(t, list) and wanted in t)


def _properties(schema: object) -> list[tuple[str, Any]]:
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    return list(props.items()) if isinstance(props, Mapping) else []


def _format(prop: Any) -> str:
    if _type_is(prop, "number") or _type_is(prop, "integer"):
        return "number"
    if _type_is(prop, "string"):
        fmt = prop.get("format")
        if fmt in ("date", "date-time"):
            return "date"
        if fmt in ("uri", "uri-reference", "url"):
            return "link"
    return "text"


def _titlecase(key: str) -> str:
    spaced = re.sub(r"[_\-.]", " ", key)
    out = ""
    prev_lower = False
    for i, ch in enumerate(spaced):
        if ch.isascii() and ch.isupper() and prev_lower:
            out += " "
        prev_lower = ch.isascii() and ch.islower()
        out += ch.upper() if i == 0 or out.endswith(" ") else ch
    collapsed = " ".join(out.split())
    return collapsed or key


def _row_item(schema: Any, rows_path: str | None) -> Any:
    if _type_is(schema, "array"):
        return schema.get("items")
    props = dict(_properties(schema))
    if rows_path:
        key = rows_path.removeprefix("$.").split(".")[-1]
        if _type_is(props.get(key), "array"):
            return props[key].get("items")
    return next((p.get("items") for p in props.values() if _type_is(p, "array")), None)


def _derive_columns(output: object, rows_path: str | None) -> list[dict[str, Any]]:
    item = _row_item(output, rows_path)
    keys = [(k, p) for k, p in _properties(item) if k and "." not in k][:_MAX_DERIVED]
    return [{"field": f"$.{k}", "header": _titlecase(k), "format": _format(p)} for k, p in keys]


def _derive_fields(schema: object, as_path: bool) -> list[dict[str, Any]]:
    keys = [(k, p) for k, p in _properties(schema) if k and "." not in k][:_MAX_DERIVED]
    return [
        {
            "field": f"$.{k}" if as_path else k,
            "label": p.get("title") if isinstance(p, Mapping) and isinstance(p.get("title"), str) else _titlecase(k),
            "format": _format(p),
        }
        for k, p in keys
    ]


_ISLAND_ESCAPES = str.maketrans({c: f"\\u{ord(c):04x}" for c in "<>&\u2028\u2029"})
"""What of the JSON could end the ``<script>`` or a line of it, as ``\\uXXXX`` escapes."""


def _island(config: Mapping[str, object]) -> str:
    text = orjson.dumps(config, option=orjson.OPT_SORT_KEYS).decode().translate(_ISLAND_ESCAPES)
    return f'<script type="application/json" id="mcpg-app-config">{text}</script>'


def _descriptor_meta(app: Mapping[str, Any], uri: str) -> dict[str, Any]:
    """``build_descriptor_meta`` (the policy clamps it again whenever it is served)."""
    ui: dict[str, Any] = {"resourceUri": uri}
    csp = app.get("csp") or {}
    axes = {
        wire: list(csp[key])
        for key, wire in (
            ("connect_domains", "connectDomains"),
            ("resource_domains", "resourceDomains"),
            ("frame_domains", "frameDomains"),
        )
        if csp.get(key)
    }
    if axes:
        ui["csp"] = axes
    if app.get("permissions"):
        ui["permissions"] = {_PERMISSIONS[p]: {} for p in app["permissions"]}
    if app.get("prefers_border") is not None:
        ui["prefersBorder"] = bool(app["prefers_border"])
    return {"ui": ui}


def compile_app(app: Mapping[str, object], tools: Mapping[str, Mapping[str, object]]) -> dict[str, Any]:
    """One registry entry as a declared resource pipeline (``ui://mcpg/<id>``): its HTML and its ``_meta``.
    ``tools``: the bindings' schemas by name (``input``, ``output``), for the introspected defaults."""
    uri = f"ui://mcpg/{app['id']}"
    config = _window_config(app, tools.get(str(app.get("data_tool"))) if app.get("data_tool") else None)
    html = _SHELL.read_text().replace(_MARKER, _island(config), 1)
    meta = _descriptor_meta(app, uri)
    return {
        "name": app["id"],
        "title": app.get("title"),
        "description": app.get("description") or "",
        "surface": "resource",
        "uri": uri,
        "mime_type": APP_MIME,
        "meta": meta,
        "answer": "mcpg.payload",
        "steps": [
            {
                "kind": "mock",
                "id": "app",
                "response": {"contents": [{"uri": uri, "mimeType": APP_MIME, "text": html, "_meta": meta}]},
            }
        ],
    }
