"""The layers stay separate: the Python package has no import cycles and the wrappers
(ringlet.hvd, ringlet.jupyter) use only the public API; in the Rust core, each layer imports only
from the layers below it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "ringlet"
SRC = ROOT / "src"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def python_modules() -> dict[str, Path]:
    """Every module of the package; the extension by its stub (`_core.pyi`)."""
    paths = sorted([*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyi")])
    return {module_name(p): p for p in paths}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The ringlet modules ``path`` imports (anywhere in it, lazily or not)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("ringlet"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if not base.startswith("ringlet"):
                continue
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules else base)
    return {m for m in found if m in modules and m != name}


def test_the_python_package_has_no_import_cycles():
    modules = python_modules()
    graph = {name: imports_of(path, modules) for name, path in modules.items()}
    assert graph["ringlet._allreduce"] >= {"ringlet.selector"}, "the parser sees imports"
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for child in sorted(graph[node]):
            if state.get(child) == "open":
                cycle = [*trail[trail.index(child):], child] if child in trail else [node, child]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if child not in state:
                visit(child, [*trail, child])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_the_mpi_loader_stands_below_the_core():
    """_mpi_abi decides and loads the MPI library before the core exists, and tools/ and
    ringletrun ask it without loading anything: it may import no ringlet module."""
    modules = python_modules()
    assert imports_of(modules["ringlet._mpi_abi"], modules) == set()
    assert "ringlet._mpi_abi" in imports_of(modules["ringlet"], modules)


WRAPPERS = ("ringlet.hvd", "ringlet.jupyter")
"""Pure adapters over the public API: the Horovod API, and the notebook helpers."""


def test_the_wrappers_use_only_the_public_api():
    modules = python_modules()
    wrappers = [name for name in modules if name.startswith(WRAPPERS)]
    assert {w for w in WRAPPERS if any(n.startswith(w) for n in wrappers)} == set(WRAPPERS)
    for name in wrappers:
        path = modules[name]
        own = name.split(".")[:2]
        for imported in imports_of(path, modules):
            # ringlet.run (ringletrun's launcher detection) touches no core either.
            assert imported in ("ringlet", "ringlet.run") or imported.split(".")[:2] == own, (
                f"{name} imports {imported}, which is not ringlet's public API"
            )
        assert "_core" not in path.read_text(), f"{name} touches ringlet._core"


# Rust: which top-level modules of the crate each layer may use.
ALLOWED = {
    "transport": {"error", "transport"},
    "kernels": {"dtype", "error", "kernels"},
    "schedules": {"dtype", "error", "kernels", "transport", "scratch", "schedules"},
    "runtime": {"auto", "dtype", "error", "kernels", "probe", "runtime", "schedules", "scratch",
                "stats", "transport", "worker"},
    "simulate": {"dtype", "error", "kernels", "schedules", "simulate", "transport"},
}
FORBIDDEN_IN_BINDINGS = {"schedules", "kernels", "transport"}


def crate_uses(path: Path) -> set[str]:
    """Top-level crate modules a file names (`crate::x`), including grouped `use crate::{..}`."""
    text = path.read_text()
    used = set(re.findall(r"crate::(\w+)", text))
    for group in re.findall(r"crate::\{([^}]*)\}", text):
        used.update(re.findall(r"^\s*(\w+)", part)[0] for part in group.split(",") if part.strip())
    return used


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_rust_layer_imports_only_from_below(layer):
    files = sorted((SRC / layer).rglob("*.rs")) if (SRC / layer).is_dir() else []
    assert files, f"no files in src/{layer}"
    for path in files:
        extra = crate_uses(path) - ALLOWED[layer]
        assert not extra, f"{path.relative_to(ROOT)} uses crate::{sorted(extra)}"
        if layer != "bindings":
            assert "pyo3" not in path.read_text(), f"{path.relative_to(ROOT)} uses pyo3"


def test_the_bindings_reach_the_core_only_through_the_runtime():
    files = sorted((SRC / "bindings").rglob("*.rs"))
    assert files
    for path in files:
        used = crate_uses(path)
        assert not used & FORBIDDEN_IN_BINDINGS, f"{path.relative_to(ROOT)} uses {used}"
        assert "runtime::consistency" not in path.read_text(), path
