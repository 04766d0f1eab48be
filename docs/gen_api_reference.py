"""Writes docs/api.md, the HTTP API reference, from the OpenAPI document the nodes serve.

The document is `node.api.openapi.document()` with its default limits (what a node with default
settings serves at `/v1/openapi.json`); nothing here describes the API a second time.

    python docs/gen_api_reference.py           # rewrite docs/api.md
    python docs/gen_api_reference.py --check   # exit 1 when docs/api.md is out of date

`tests/test_docs_generated.py` runs the check.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from node.api.openapi import document

REPOSITORY = Path(__file__).resolve().parent.parent
OUTPUT = REPOSITORY / "docs" / "api.md"
_METHODS = ("get", "put", "post", "delete", "patch")
# Constraints shown beside a property or parameter, in this order.
_CONSTRAINTS = (
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "minLength",
    "maxLength",
    "maxItems",
    "uniqueItems",
    "pattern",
)


def _cell(text: str) -> str:
    """Text that fits in one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _schema_link(reference: str) -> str:
    name = reference.rsplit("/", 1)[-1]
    return f"[`{name}`](#{_slug(_schema_heading(name))})"


def _schema_heading(name: str) -> str:
    return f"Schema {name}"


def _type(schema: dict[str, Any]) -> str:
    """A schema's type in a few words, with links to named schemas."""
    if "$ref" in schema:
        return _schema_link(schema["$ref"])
    for combinator in ("oneOf", "anyOf"):
        if combinator in schema and "type" not in schema:
            return " or ".join(_type(option) for option in schema[combinator])
    kind = schema.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    words = []
    for item in kinds:
        if item == "array":
            words.append("array of " + _type(schema.get("items", {})))
        else:
            words.append(str(item))
    return " or ".join(words)


def _details(schema: dict[str, Any]) -> str:
    """A schema's enum, bounds, pattern and default, in one line."""
    parts = []
    if "enum" in schema:
        parts.append("one of " + ", ".join(f"`{json.dumps(value)}`" for value in schema["enum"]))
    for name in _CONSTRAINTS:
        if name in schema:
            value = schema[name]
            shown = f"`{value}`" if name == "pattern" else json.dumps(value)
            parts.append(f"{name} {shown}")
    items = schema.get("items", {})
    if "enum" in items:
        parts.append("items one of " + ", ".join(f"`{json.dumps(v)}`" for v in items["enum"]))
    if "default" in schema:
        parts.append(f"default `{json.dumps(schema['default'])}`")
    return "; ".join(parts)


def _describe(description: str, details: str) -> str:
    """A description with its constraints in brackets after it."""
    if not details:
        return description
    return f"{description} ({details})" if description else details


def _resolve(spec: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """`item`, or what its `$ref` names (within the document)."""
    reference = item.get("$ref")
    if reference is None:
        return item
    node: Any = spec
    for part in reference.removeprefix("#/").split("/"):
        node = node[part]
    assert isinstance(node, dict)
    return node


def _parameters(spec: dict[str, Any], operation: dict[str, Any], path_item: dict[str, Any]) -> str:
    parameters = [
        _resolve(spec, item)
        for item in (*path_item.get("parameters", ()), *operation.get("parameters", ()))
    ]
    if not parameters:
        return ""
    lines = [
        "| parameter | in | type | required | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for parameter in parameters:
        schema = parameter.get("schema", {})
        description = _describe(parameter.get("description", ""), _details(schema))
        lines.append(
            f"| `{parameter['name']}` | {parameter['in']} | {_type(schema)} | "
            f"{'yes' if parameter.get('required') else 'no'} | {_cell(description)} |"
        )
    return "\n".join(lines) + "\n"


def _body_schema(content: dict[str, Any]) -> str:
    media: dict[str, Any] = content.get("application/json") or next(iter(content.values()), {})
    schema = media.get("schema", {})
    return _type(schema) if schema else "-"


def _operation(
    spec: dict[str, Any],
    method: str,
    path: str,
    operation: dict[str, Any],
    path_item: dict[str, Any],
) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", ""]
    summary = operation.get("summary", "")
    if summary:
        lines += [summary.rstrip(".") + ".", ""]
    if operation.get("description"):
        lines += [_cell(operation["description"]), ""]
    facts = [f"Operation id `{operation['operationId']}`"]
    if operation.get("security") == []:
        facts.append("no token needed")
    lines += ["; ".join(facts) + ".", ""]
    parameters = _parameters(spec, operation, path_item)
    if parameters:
        lines += [parameters]
    body = operation.get("requestBody")
    if body is not None:
        body = _resolve(spec, body)
        required = "required" if body.get("required") else "optional"
        lines += [f"Request body ({required}): {_body_schema(body.get('content', {}))}.", ""]
    successes = []
    errors = []
    for status, response in operation.get("responses", {}).items():
        if "$ref" in response:
            name = response["$ref"].rsplit("/", 1)[-1]
            errors.append(f"[{status}](#{_slug('Errors')})" if name.startswith("Error") else status)
            continue
        content = response.get("content", {})
        shape = _body_schema(content) if content else "no body"
        kinds = ", ".join(f"`{media}`" for media in content)
        suffix = f" ({kinds})" if kinds and set(content) != {"application/json"} else ""
        description = _cell(response.get("description", ""))
        successes.append(f"- `{status}` {description}: {shape}{suffix}")
    if successes:
        lines += ["Responses:", "", *successes, ""]
    if errors:
        lines += ["Errors: " + ", ".join(errors) + ".", ""]
    return lines


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {_schema_heading(name)}", ""]
    if schema.get("description"):
        lines += [_cell(schema["description"]), ""]
    properties = schema.get("properties")
    if not properties:
        details = _details(schema)
        lines += [f"Type: {_type(schema)}" + (f"; {details}" if details else "") + ".", ""]
        return lines
    required = set(schema.get("required", ()))
    lines += [
        "| property | type | required | description |",
        "| --- | --- | --- | --- |",
    ]
    for property_name, property_schema in properties.items():
        description = _describe(property_schema.get("description", ""), _details(property_schema))
        lines.append(
            f"| `{property_name}` | {_type(property_schema)} | "
            f"{'yes' if property_name in required else 'no'} | {_cell(description)} |"
        )
    lines.append("")
    for combinator in ("oneOf", "anyOf"):
        options = schema.get(combinator, ())
        if options and all(set(option) == {"required"} for option in options):
            choices = " or ".join(
                " and ".join(f"`{field}`" for field in option["required"]) for option in options
            )
            lines += [f"Exactly one of: {choices}.", ""]
    if schema.get("additionalProperties") is False:
        lines += ["No other properties are accepted.", ""]
    return lines


def render() -> str:
    spec = document()
    info = spec["info"]
    lines = [
        "# HTTP API reference",
        "",
        "<!-- Generated by docs/gen_api_reference.py from node/api/openapi.py; "
        "do not edit by hand. -->",
        "",
        f"{info['title']}, version {info['version']} (OpenAPI {spec['openapi']}). Every node "
        "serves the document itself at `/v1/openapi.json`; this page is generated from it with a "
        "node's default limits (`http.wait_max_s` 60, `http.body_bytes_max` 1048576). "
        "[docs/node.md](node.md#http-api) explains the API's rules, [concepts](concepts.md) "
        "what each call guarantees.",
        "",
        _cell(info.get("description", "")),
        "",
        "## Authentication",
        "",
    ]
    for scheme_name, scheme in spec["components"].get("securitySchemes", {}).items():
        lines.append(
            f"- `{scheme_name}` ({scheme.get('type')} {scheme.get('scheme', '')}): "
            f"{_cell(scheme.get('description', ''))}"
        )
    lines += ["", "## Headers", "", "| header | description |", "| --- | --- |"]
    for header_name, header in spec["components"].get("headers", {}).items():
        lines.append(f"| `{header_name}` | {_cell(header.get('description', ''))} |")
    lines += ["", "## Errors", ""]
    lines += [
        "Every error answers the `Error` schema "
        f"({_schema_link('#/components/schemas/Error')}) with this status:",
        "",
        "| status | meaning |",
        "| --- | --- |",
    ]
    for response_name, response in spec["components"].get("responses", {}).items():
        status = response_name.removeprefix("Error")
        lines.append(f"| {status} | {_cell(response.get('description', ''))} |")
    lines.append("")
    tags = [tag["name"] for tag in spec.get("tags", ())]
    operations: dict[str, list[tuple[str, str, dict[str, Any], dict[str, Any]]]] = {
        tag: [] for tag in tags
    }
    for path, path_item in spec["paths"].items():
        for method in _METHODS:
            operation = path_item.get(method)
            if operation is None:
                continue
            tag = (operation.get("tags") or ["other"])[0]
            operations.setdefault(tag, []).append((method, path, operation, path_item))
    lines += ["## Operations", ""]
    for tag, items in operations.items():
        if not items:
            continue
        heading = f"`{tag}` operations"
        lines.append(
            f"- [{heading}](#{_slug(heading)}): "
            + ", ".join(f"`{method.upper()} {path}`" for method, path, _, _ in items)
        )
    lines.append("")
    for tag, items in operations.items():
        if not items:
            continue
        lines += [f"## `{tag}` operations", ""]
        for method, path, operation, path_item in items:
            lines += _operation(spec, method, path, operation, path_item)
    lines += ["## Schemas", ""]
    for schema_name, schema in spec["components"].get("schemas", {}).items():
        lines += _schema(schema_name, schema)
    while lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    arguments = parser.parse_args(argv)
    text = render()
    if arguments.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is out of date: run python docs/gen_api_reference.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
