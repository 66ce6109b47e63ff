"""mkdocs hook: a page line ``<!-- README: Section title -->`` is replaced by that section of
README.md (its subsections too; ``<!-- README: Title (alone) -->`` stops at the first
subsection), and ``<!-- CONTRIBUTING: ... -->``/``<!-- RESULTS: ... -->`` by one of
CONTRIBUTING.md or benchmarks/RESULTS.md, so the site and the repository's own pages never
disagree. Headings move up one level to sit
under the page's own title; links to files of the repository, which are not pages of the site,
keep their text and show the path as code; links to README anchors keep their words."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"README": "README.md", "CONTRIBUTING": "CONTRIBUTING.md",
           "RESULTS": "benchmarks/RESULTS.md"}
MARKER = re.compile(r"^<!-- (README|CONTRIBUTING|RESULTS): (.+?)( \(alone\))? -->$", re.M)
HEADING = re.compile(r"^(#{2,4}) (.+)$")


def section(source: str, title: str, alone: bool) -> str:
    lines = (ROOT / SOURCES[source]).read_text().split("\n")
    start = level = None
    for i, line in enumerate(lines):
        found = HEADING.match(line)
        if not found:
            continue
        depth = len(found[1])
        if start is None and found[2].strip() == title:
            start, level = i + 1, depth
        elif start is not None and (depth <= level or alone):
            return _adapt("\n".join(lines[start:i]))
    if start is None:
        raise ValueError(f"{SOURCES[source]} has no section {title!r}")
    return _adapt("\n".join(lines[start:]))


def _adapt(text: str) -> str:
    # One level up: a section (## or ###) sits under the page's title or one of its own ##.
    text = re.sub(r"^#(#{2,}) ", r"\1 ", text, flags=re.M)
    text = re.sub(r"\[([^\]]+)\]\((?!#|https?:)([^)]+)\)", r"\1 (`\2`)", text)
    return re.sub(r"\[([^\]]+)\]\(#[^)]+\)", r"\1", text).strip("\n")


def on_page_markdown(markdown: str, **_: object) -> str:
    return MARKER.sub(lambda m: section(m[1], m[2], bool(m[3])), markdown)
