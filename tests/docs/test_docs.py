"""The documentation site: `mkdocs build --strict` passes (no broken link, no missing page, no
docstring the API reference cannot read), every public name of ringlet, ringlet.hvd and
ringlet.jupyter is in the API reference with its docstring, the README sections the pages
include exist, and the environment table names every RINGLET_* variable the sources read."""

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


def test_the_pages_include_their_readme_sections(site):
    # A section renamed in README.md fails the build (the hook raises); here, that what was
    # included is really there.
    running = page_text(site / "guide/running/index.html")
    assert "ringletrun -np 4 python train.py --lr 0.1" in running
    failures = page_text(site / "guide/failures/index.html")
    assert "RINGLET_STALL_WARNING" in failures and "MismatchError" in failures
    assert "<!-- README" not in (site / "guide/topology/index.html").read_text()


def test_the_environment_table_names_every_variable_the_sources_read():
    sources = [p for pattern in ("*.rs", "*.py", "*.sh", "*.pyi")
               for folder in ("src", "python", "tools") for p in (ROOT / folder).rglob(pattern)]
    read = {v for p in sources for v in re.findall(r"RINGLET_[A-Z0-9_]*[A-Z0-9]", p.read_text())}
    table = (ROOT / "docs/guide/environment.md").read_text()
    listed = set(re.findall(r"`(RINGLET_[A-Z0-9_]+)`", table))
    assert read, "no RINGLET_ variable found in the sources"
    assert not read - listed, f"not in docs/guide/environment.md: {sorted(read - listed)}"
