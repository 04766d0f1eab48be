"""Every relative link in README.md and docs/*.md points to a file that exists, and to a heading
of that file when it names an anchor; no link points to localhost (a reader's machine is not the
author's). Links inside fenced code blocks and inline code are not links and are skipped."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
DOCUMENTS = sorted([REPOSITORY / "README.md", *(REPOSITORY / "docs").glob("*.md")])
# Targets that scripts write and git ignores, so a fresh checkout lacks them until they run.
WRITTEN_BY_SCRIPTS = {
    "bench/results/scheduler.png": "python bench/scheduler.py",
}
# [text](target) and ![alt](target), with an optional "title"; <scheme://...> autolinks.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_AUTOLINK = re.compile(r"<([a-z][a-z0-9+.-]*://[^>\s]+)>", re.IGNORECASE)
_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LOCALHOST = re.compile(r"^[a-z][a-z0-9+.-]*://(localhost|127\.|\[::1\]|0\.0\.0\.0)", re.I)


def _prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code removed."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, _INLINE_CODE.sub("", line)


def links(text: str) -> Iterator[tuple[int, str]]:
    for number, line in _prose_lines(text):
        for match in _LINK.finditer(line):
            yield number, match.group(1)
        for match in _AUTOLINK.finditer(line):
            yield number, match.group(1)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = _INLINE_CODE.sub(lambda match: match.group(0).strip("`"), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 for repeated headings."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        seen = counts.get(base, 0)
        counts[base] = seen + 1
        found.add(base if seen == 0 else f"{base}-{seen}")
    found.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return found


def problems(document: Path, text: str | None = None) -> list[str]:
    """What is wrong with the links of `document` (or of `text`, read as if it were there)."""
    if text is None:
        text = document.read_text()
    found = []
    for number, target in links(text):
        where = f"{document.relative_to(REPOSITORY)}:{number}: {target}"
        if _LOCALHOST.match(target):
            found.append(f"{where}: a link to localhost")
            continue
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # https:, mailto: and other absolute links are not checked here
        path_part, _, anchor = target.partition("#")
        path = (document.parent / unquote(path_part)).resolve() if path_part else document
        relative = (
            path.relative_to(REPOSITORY).as_posix() if path.is_relative_to(REPOSITORY) else ""
        )
        if not path.exists():
            if relative not in WRITTEN_BY_SCRIPTS:
                found.append(f"{where}: no such file")
            continue
        if anchor and path.suffix == ".md" and anchor not in anchors(path.read_text()):
            found.append(f"{where}: no heading #{anchor} in {relative}")
    return found


def test_links__found_in_prose_not_in_code() -> None:
    text = "\n".join(
        [
            'See [a](a.md#x), ![b](img/b.png "B") and <https://example.org/>.',
            "Not `[c](c.md)` nor:",
            "```",
            "[d](d.md)",
            "```",
        ]
    )
    assert [target for _, target in links(text)] == ["a.md#x", "img/b.png", "https://example.org/"]


def test_anchors__follow_githubs_rules() -> None:
    text = "# Title\n## `bench/api.py`: xr's API\n## Title\n```\n# not a heading\n```\n"
    assert anchors(text) == {"title", "benchapipy-xrs-api", "title-1"}


def test_problems__reports_missing_files_anchors_and_localhost() -> None:
    document = REPOSITORY / "docs" / "quickstart.md"
    assert problems(document, "[a](concepts.md#what-each-call-guarantees) [b](../README.md)") == []
    text = "[a](no-such.md) [b](concepts.md#no-such-heading) [c](http://localhost:8700/ui)"
    assert len(problems(document, text)) == 3


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_document__relative_links_resolve(document: Path) -> None:
    assert problems(document) == []
