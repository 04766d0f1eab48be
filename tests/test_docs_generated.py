"""The generated references are what their generators write from today's code: docs/api.md from
the OpenAPI document (docs/gen_api_reference.py) and docs/client.md from xrcore.client
(docs/gen_client_reference.py). A failure names the command that brings the file up to date.
(docs/metrics.md is checked by tests/node/test_metrics_catalogue.py.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import click
import pytest

REPOSITORY = Path(__file__).resolve().parent.parent


def _generator(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"xr_docs_{name}", REPOSITORY / "docs" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs, as an imported module would be.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("generator", "output"),
    [("gen_api_reference", "api.md"), ("gen_client_reference", "client.md")],
)
def test_generated_reference__is_up_to_date(generator: str, output: str) -> None:
    expected = _generator(generator).render()
    actual = (REPOSITORY / "docs" / output).read_text()
    assert actual == expected, f"docs/{output} is out of date: run python docs/{generator}.py"


def test_generated_reference__is_deterministic() -> None:
    module = _generator("gen_client_reference")
    assert module.render() == module.render()


def test_client_reference__documents_every_method_of_every_group() -> None:
    module = _generator("gen_client_reference")
    text = module.render()
    for group, blocking, _ in module.GROUPS:
        for name in vars(blocking):
            if not name.startswith("_"):
                assert f"`client.{group}.{name}(" in text, f"client.{group}.{name} is missing"


def test_api_reference__documents_every_operation() -> None:
    from node.api.openapi import document

    text = _generator("gen_api_reference").render()
    for path, item in document()["paths"].items():
        for method in item:
            assert f"### `{method.upper()} {path}`" in text


def _command_paths(group: click.Group, prefix: str) -> list[str]:
    paths = []
    for name, command in sorted(group.commands.items()):
        path = f"{prefix} {name}"
        if isinstance(command, click.Group):
            paths += _command_paths(command, path)
        else:
            paths.append(path)
    return paths


def test_cli_guide__names_every_command() -> None:
    """docs/cli.md is written by hand; this keeps it from missing a command `xr --help` has."""
    from node.cli import xr

    guide = (REPOSITORY / "docs" / "cli.md").read_text()
    paths = _command_paths(xr, "xr")
    assert "xr kv put" in paths and "xr tenant set" in paths
    missing = [path for path in paths if f"`{path}" not in guide]
    assert not missing, f"docs/cli.md does not mention {missing}"
