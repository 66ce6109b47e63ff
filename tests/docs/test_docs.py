"""The documentation site: `mkdocs build --strict` passes (no broken link, no missing page, no
docstring the API reference cannot read), every public name of ringlet, ringlet.hvd and
ringlet.jupyter is in the API reference with its docstring, the site is built from docs/ alone,
the README stays short and its links lead to pages that exist, and the environment table names
every RINGLET_* variable the sources read."""

from __future__ import annotations

import html
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ringlet
import ringlet.hvd
import ringlet.jax
import ringlet.jupyter

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def page_text(path: Path) -> str:
    """The page's text, tags removed and entities decoded, whitespace collapsed."""
    text = re.sub(r"<[^>]+>", "", path.read_text())
    return " ".join(html.unescape(text).split())


def first_line(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.strip().split("\n")[0].strip()


@pytest.mark.parametrize(("module", "page"), [
    (ringlet, "reference/ringlet/index.html"),
    (ringlet.hvd, "reference/hvd/index.html"),
    (ringlet.jupyter, "reference/jupyter/index.html"),
    (ringlet.jax, "reference/jax/index.html"),
    ("ringlet.hvd.tensorflow", "reference/hvd_tensorflow/index.html"),
])
def test_every_public_name_is_in_the_api_reference_with_its_docstring(site, module, page):
    if isinstance(module, str):
        # A framework adapter: its own names (it re-exports ringlet.hvd's, documented there).
        module = importlib.import_module(module)
        names = [n for n in module.__all__
                 if getattr(getattr(module, n), "__module__", None) == module.__name__]
    else:
        names = module.__all__
    source = (site / page).read_text()
    text = page_text(site / page)
    missing, undocumented = [], []
    for name in names:
        if f'id="{module.__name__}.{name}"' not in source:
            missing.append(name)
            continue
        obj = getattr(module, name)
        if callable(obj):
            line = first_line(obj)
            if not line:
                undocumented.append(name)
            elif " ".join(html.unescape(re.sub(r"`+", "", line)).split()) not in text.replace(
                    "`", ""):
                undocumented.append(f"{name}: {line!r}")
    assert not missing, f"not in {page}: {missing}"
    assert not undocumented, f"docstrings missing from {page}: {undocumented}"


def test_the_site_is_built_from_docs_alone(site):
    # No hook splices README.md, CONTRIBUTING.md or benchmarks/RESULTS.md into the pages: what
    # a page says is in its own file, and the build above used nothing else.
    config = (ROOT / "mkdocs.yml").read_text()
    assert not re.search(r"^hooks:", config, re.M), "mkdocs.yml runs a hook"
    pages = sorted((ROOT / "docs").rglob("*.md"))
    assert len(pages) > 20, pages
    marker = re.compile(r"<!-- (README|CONTRIBUTING|RESULTS)\b")
    spliced = [f"{p.relative_to(ROOT)}: {line}"
               for p in pages for line in p.read_text().splitlines() if marker.match(line)]
    assert not spliced, spliced
    assert not list((ROOT / "docs").rglob("*.py")), "docs/ holds code"
    # What moved out of the README is on the pages, built.
    running = page_text(site / "guide/running/index.html")
    assert "ringletrun -np 4 python train.py --lr 0.1" in running
    failures = page_text(site / "guide/failures/index.html")
    assert "RINGLET_STALL_WARNING" in failures and "MismatchError" in failures
    horovod = page_text(site / "guide/horovod/index.html")
    assert "RINGLET_HVD_MATCHING=order" in horovod and "Adasum" in horovod
    api = page_text(site / "guide/api/index.html")
    assert "add_process_set" in api and "bfloat16" in api


README_LINES = 300


def heading_anchors(page: Path) -> set[str]:
    """The anchors mkdocs gives a page's headings (its toc extension's slugs)."""
    anchors, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} (.+)", line)
        if heading:
            text = re.sub(r"[^\w\s-]", "", heading[1].strip().lower())
            anchors.add(re.sub(r"[-\s]+", "-", text).strip("-"))
    return anchors


def test_the_readme_is_short_and_its_links_lead_somewhere():
    readme = (ROOT / "README.md").read_text()
    lines = readme.count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines, more than {README_LINES}"
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in local), links
    broken = []
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        if not target.is_file():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in heading_anchors(target):
            broken.append(f"{link}: {path} has no heading #{anchor}")
    assert not broken, broken
    # Every page of the site's user guide is reachable from the README's table.
    guide = {f"docs/{p.relative_to(ROOT / 'docs')}" for p in (ROOT / "docs/guide").glob("*.md")}
    assert not guide - set(local), f"pages the README does not link: {sorted(guide - set(local))}"


def test_the_environment_table_names_every_variable_the_sources_read():
    sources = [p for pattern in ("*.rs", "*.py", "*.sh", "*.pyi")
               for folder in ("src", "python", "tools") for p in (ROOT / folder).rglob(pattern)]
    read = {v for p in sources for v in re.findall(r"RINGLET_[A-Z0-9_]*[A-Z0-9]", p.read_text())}
    table = (ROOT / "docs/guide/environment.md").read_text()
    listed = set(re.findall(r"`(RINGLET_[A-Z0-9_]+)`", table))
    assert read, "no RINGLET_ variable found in the sources"
    assert not read - listed, f"not in docs/guide/environment.md: {sorted(read - listed)}"
