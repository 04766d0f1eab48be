"""docs/node.md's sample configuration: the README sends readers there for every setting."""

from __future__ import annotations

import re
from pathlib import Path

from node.config import _known_settings, load_config

ROOT = Path(__file__).resolve().parents[2]


def _sample() -> str:
    text = (ROOT / "docs" / "node.md").read_text()
    found = re.search(r"```toml\n(.*?)```", text, re.S)
    assert found, "docs/node.md has no TOML sample"
    return found.group(1)


def _sections(sample: str) -> dict[str, str]:
    """The sample's text by table name ("" for the top level); `[[auth.tokens]]` goes to auth."""
    sections: dict[str, str] = {"": ""}
    current = ""
    for line in sample.splitlines():
        header = re.match(r"\[\[?([a-z_]+)", line)
        if header:
            current = header.group(1)
            sections.setdefault(current, "")
        sections[current] += line + "\n"
    return sections


def test_every_setting_is_in_the_sample_under_its_table() -> None:
    sections = _sections(_sample())
    missing = []
    for dotted in _known_settings():
        table, _, name = dotted.rpartition(".")
        text = sections.get(table, "")
        if not re.search(rf"(^|[\s#,]){name} =", text, re.M) and f"[[{dotted}]]" not in text:
            missing.append(dotted)
    assert missing == [], f"settings docs/node.md does not show: {missing}"


def test_the_sample_loads(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("a cluster secret\n")
    sample = _sample().replace('"/etc/xr/secret"', f'"{secret}"')
    sample = sample.replace('"<64 hex digits>"', '"' + "0" * 64 + '"')
    path = tmp_path / "node.toml"
    path.write_text(sample)
    config = load_config(path=path, environ={})
    assert config.region.name == "eu-west" and config.executor.job_user is None
