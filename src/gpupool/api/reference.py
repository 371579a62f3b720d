"""``/docs``: the API reference as one HTML page built from the OpenAPI document.

FastAPI's own ``/docs`` (Swagger UI) and ``/redoc`` load their scripts and styles from a CDN, so
on a machine without internet access they were a blank page. This page has no script and no
external resource: every operation of ``/openapi.json`` grouped by tag, with its method, path,
summary, parameters, request body and responses (schema names link to the schema list at the
end). Tools that want the full document read ``/openapi.json`` itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

METHODS = ("get", "post", "put", "patch", "delete")

STYLE = """
body{font-family:system-ui,sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem;
color:#1b1b1b;line-height:1.4}
code,pre{font-family:ui-monospace,monospace;font-size:.9em}
h2{border-bottom:1px solid #ccc;margin-top:2rem}
.op{margin:.6rem 0;padding:.4rem .6rem;border-left:4px solid #888;background:#f6f6f6}
.m{display:inline-block;min-width:4.5rem;font-weight:bold}
.get{border-color:#2f6fb3}.post{border-color:#2e8540}.put,.patch{border-color:#b36b00}
.delete{border-color:#b3261e}
table{border-collapse:collapse}td,th{padding:.1rem .6rem;text-align:left;vertical-align:top}
"""


def _ref(schema: Mapping[str, Any] | None) -> str:
    """A schema as a short type: a link to a named schema, ``array of X``, or its type."""
    if not schema:
        return "-"
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return f'<a href="#schema-{escape(name)}">{escape(name)}</a>'
    if schema.get("type") == "array":
        return "array of " + _ref(schema.get("items"))
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " | ".join(_ref(s) for s in schema[key])
    return escape(str(schema.get("type", "object")))


def _schema_of(content: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The schema of the first media type of a body or response, if any."""
    for media in content.values():
        schema: Mapping[str, Any] | None = media.get("schema")
        return schema
    return None


def _body(op: Mapping[str, Any]) -> str:
    schema = _schema_of(op.get("requestBody", {}).get("content", {}))
    return f"<div>body: {_ref(schema)}</div>" if schema else ""


def _parameters(op: Mapping[str, Any]) -> str:
    params = op.get("parameters", [])
    if not params:
        return ""
    rows = "".join(
        f"<tr><td><code>{escape(str(p.get('name')))}</code></td><td>{escape(str(p.get('in')))}"
        f"</td><td>{'required' if p.get('required') else ''}</td>"
        f"<td>{_ref(p.get('schema'))}</td></tr>"
        for p in params
    )
    return f"<table>{rows}</table>"


def _responses(op: Mapping[str, Any]) -> str:
    parts = []
    for code, resp in op.get("responses", {}).items():
        schema = _schema_of(resp.get("content", {}))
        parts.append(f"{escape(str(code))} {_ref(schema) if schema else ''}".strip())
    return f"<div>responses: {', '.join(parts)}</div>" if parts else ""


def api_reference_html(openapi: Mapping[str, Any]) -> str:
    """The reference page for one OpenAPI document (see the module docstring)."""
    info = openapi.get("info", {})
    by_tag: dict[str, list[str]] = {}
    for path, item in openapi.get("paths", {}).items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            tag = (op.get("tags") or ["other"])[0]
            summary = escape(str(op.get("summary", "")))
            desc = str(op.get("description", "")).strip().split("\n\n")[0]
            by_tag.setdefault(tag, []).append(
                f'<div class="op {method}"><span class="m">{method.upper()}</span>'
                f"<code>{escape(path)}</code> {summary}"
                + (f"<div>{escape(desc)}</div>" if desc else "")
                + _parameters(op)
                + _body(op)
                + _responses(op)
                + "</div>"
            )
    sections = "".join(
        f"<h2>{escape(tag)}</h2>" + "".join(ops) for tag, ops in sorted(by_tag.items())
    )
    schemas = openapi.get("components", {}).get("schemas", {})
    schema_rows = "".join(
        f'<h3 id="schema-{escape(name)}">{escape(name)}</h3><table>'
        + "".join(
            f"<tr><td><code>{escape(field)}</code></td><td>{_ref(spec)}</td></tr>"
            for field, spec in schema.get("properties", {}).items()
        )
        + "</table>"
        for name, schema in sorted(schemas.items())
    )
    title = escape(f"{info.get('title', 'API')} {info.get('version', '')}".strip())
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title} API</title><style>{STYLE}</style></head><body>"
        f"<h1>{title} API</h1><p>{escape(str(info.get('description', '')))}</p>"
        "<p>Every call but the health checks takes <code>Authorization: Bearer TOKEN</code> "
        "(<code>gpupool login</code> saves one; the first admin token is in "
        "<code>$GPUPOOL_HOME/admin-token</code>). The machine-readable document is "
        '<a href="/openapi.json">/openapi.json</a>.</p>'
        f"{sections}<h2>Schemas</h2>{schema_rows}</body></html>"
    )
