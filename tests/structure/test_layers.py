"""The layers stay separate. Both layer tables (the crate's and the Python package's) are read
from docs/contributing/layers.md, the one place they are written. In the Python package: each
module imports only from the rows below its own in PY_LAYERS, no import cycles, the wrappers
(ringlet.hvd, ringlet.jupyter) use only the public API, no private name is imported across
modules, every public module has `__all__`, and no record crosses from the core as a positional
tuple. In the Rust core (read as text: comments and `#[cfg(test)]` modules left out), each
top-level module uses only the modules below it in LAYERS, no folder's files use each other in a
cycle (mod.rs's declarations included), only src/transport/ names the `mpi` crate, the bindings
reach the core through the runtime alone (which re-exports no module), and no schedule downcasts
its transport. The last tests put each old tangle back into a copy and see every check fail."""

from __future__ import annotations

import ast
import bisect
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# RINGLET_STRUCTURE_PACKAGE: check another copy of the Python package (see the last tests).
PACKAGE = Path(os.environ.get("RINGLET_STRUCTURE_PACKAGE", ROOT / "python" / "ringlet"))
# RINGLET_STRUCTURE_SRC: check another copy of the crate's sources (see the last test).
SRC = Path(os.environ.get("RINGLET_STRUCTURE_SRC", ROOT / "src"))


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
    assert graph["ringlet._allreduce"] >= {"ringlet.calibration"}, "the parser sees imports"
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
            # ringlet.jax is the public API for JAX arrays (ringlet.hvd.keras's JAX backend),
            # ringlet.elastic the public elastic API (ringlet.hvd.elastic's).
            assert imported in ("ringlet", "ringlet.run", "ringlet.jax", "ringlet.elastic") or \
                imported.split(".")[:2] == own, (
                f"{name} imports {imported}, which is not ringlet's public API"
            )
        assert "_core" not in path.read_text(), f"{name} touches ringlet._core"


LAYERS_PAGE = ROOT / "docs" / "contributing" / "layers.md"
"""Where the layer tables are written, once: the checks read them from there."""


def layer_table(name: str) -> list[set[str]]:
    """The rows (bottom to top) of the page's table between `<!-- layers: name -->` and
    `<!-- /layers: name -->`: each row's number, then its modules in backticks."""
    found = re.search(rf"<!-- layers: {name} -->\n(.*?)<!-- /layers: {name} -->",
                      LAYERS_PAGE.read_text(), re.DOTALL)
    assert found, f"{LAYERS_PAGE.relative_to(ROOT)} has no {name} layer table"
    rows = []
    for line in found.group(1).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            rows.append((int(cells[0]), set(re.findall(r"`([\w.]+)`", cells[1]))))
    assert [number for number, _ in rows] == list(range(1, len(rows) + 1)), (
        f"the {name} table's rows are not numbered 1, 2, ... from the bottom")
    assert all(modules for _, modules in rows), f"a row of the {name} table names no module"
    return [modules for _, modules in rows]


# Python. The package's modules, bottom to top; a module may import only the modules on the rows
# below its own (never one on its own row). A subpackage's modules count as the subpackage.
PY_LAYERS = layer_table("python")
PY_LEVEL = {module: level for level, row in enumerate(PY_LAYERS) for module in row}


def python_unit(name: str) -> str | None:
    """The row entry ``name`` falls under: itself, or the subpackage listed that holds it."""
    if name in PY_LEVEL:
        return name
    packages = [m for m in PY_LEVEL if m != "ringlet" and name.startswith(m + ".")]
    return max(packages, key=len) if packages else None


def test_the_python_layer_table_names_every_module():
    modules = python_modules()
    unlisted = sorted(name for name in modules if python_unit(name) is None)
    assert not unlisted, f"give these modules a row of the python table in layers.md: {unlisted}"
    listed = [m for row in PY_LAYERS for m in row]
    assert len(listed) == len(set(listed)), "a module is on two rows of the python table"
    assert not set(listed) - set(modules), f"listed but missing: {set(listed) - set(modules)}"


def test_each_python_module_imports_only_from_below():
    modules = python_modules()
    problems = []
    for name, path in sorted(modules.items()):
        unit = python_unit(name)
        for imported in sorted(imports_of(path, modules)):
            other = python_unit(imported)
            if unit is None or other is None or other == unit:
                continue  # unlisted (the test above says so), or inside one subpackage
            if PY_LEVEL[other] >= PY_LEVEL[unit]:
                problems.append(f"{name} imports {imported}, which is not below it "
                                f"(row {PY_LEVEL[other] + 1} against {PY_LEVEL[unit] + 1})")
    assert not problems, "\n".join(problems)




def private_imports(path: Path, modules: dict[str, Path]) -> list[str]:
    """Each private name (`_x`, not a module, not a dunder) that ``path`` takes from another
    ringlet module: `from .m import _x`, or `m._x` after importing the module m."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found, bound = [], {}
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        if not base.startswith("ringlet"):
            continue
        for alias in node.names:
            child = f"{base}.{alias.name}"
            if child in modules:
                bound[alias.asname or alias.name] = child
            elif alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append(
                    f"{name}:{node.lineno} imports the private name {alias.name} of {base}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in bound and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            found.append(f"{name}:{node.lineno} imports the private name {node.attr} of "
                         f"{bound[node.value.id]}")
    return found


def test_no_private_name_is_imported_across_modules():
    """A name that several modules share is public inside an underscore module (the module is
    what keeps it from users): `_runtime.thread_state`, not `_runtime._thread_state`."""
    modules = python_modules()
    problems = [problem for name, path in sorted(modules.items())
                if path.suffix == ".py"
                for problem in private_imports(path, modules)]
    assert not problems, "\n".join(problems)


def public_modules(modules: dict[str, Path]) -> list[str]:
    return sorted(name for name, path in modules.items()
                  if path.suffix == ".py" and not any(p.startswith("_") for p in name.split(".")))


def missing_all(path: Path) -> str | None:
    """Why ``path`` fails to declare its public names, or None: an `__all__` that lists only
    names the module defines or imports (a computed `__all__` is taken as it is)."""
    tree = ast.parse(path.read_text())
    defined: set[str] = set()
    declared = None
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for target in targets:
            if isinstance(target, ast.Name):
                defined.add(target.id)
                if target.id == "__all__":
                    declared = node.value
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
            if isinstance(node, ast.ImportFrom) and any(
                    (a.asname or a.name) == "__all__" for a in node.names):
                declared = node  # another module's __all__, re-exported with its names
        elif isinstance(node, (ast.If, ast.Try)):  # optional imports, TYPE_CHECKING
            defined.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name)
                           and isinstance(n.ctx, ast.Store))
            defined.update((a.asname or a.name).split(".")[0] for n in ast.walk(node)
                           if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names)
    if declared is None:
        return "has no __all__"
    if isinstance(declared, (ast.List, ast.Tuple)) and all(
            isinstance(e, ast.Constant) for e in declared.elts):
        unknown = sorted({e.value for e in declared.elts} - defined
                         - {p.stem for p in path.parent.iterdir()})
        if unknown:
            return f"lists in __all__ what it does not have: {unknown}"
    return None


def test_every_public_module_declares_all():
    """`__all__` says what a module offers; without it every helper it defines or imports is
    public by accident (calibration's load, save and install were)."""
    modules = python_modules()
    problems = [f"{name} {why}" for name in public_modules(modules)
                if (why := missing_all(modules[name]))]
    assert not problems, "\n".join(problems)



def row_annotation(node: ast.expr | None, lists: bool = True) -> bool:
    """Whether a stub's return annotation is a row as a tuple: a tuple of three or more fields
    (or of any length), or (with ``lists``) a list of tuples; `X | None` as X."""
    if isinstance(node, ast.BinOp):
        return row_annotation(node.left, lists) or row_annotation(node.right, lists)
    if not isinstance(node, ast.Subscript) or not isinstance(node.value, ast.Name):
        return False
    inner = node.slice
    if node.value.id == "tuple":
        fields = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        return len(fields) >= 3 or any(isinstance(f, ast.Constant) and f.value is ...
                                       for f in fields)
    if node.value.id == "list" and lists:
        return isinstance(inner, ast.Subscript) and isinstance(inner.value, ast.Name) and \
            inner.value.id == "tuple"
    return False


def rust_row_type(text: str, aliases: dict[str, str]) -> bool:
    """The same for a Rust return type, with the file's type aliases expanded."""
    text = re.sub(r"\s+", "", text)
    for _ in range(10):
        text = aliases.get(text, text)
        wrapped = re.fullmatch(r"(?:PyResult|Result|Option)<(.*)>", text)
        if not wrapped:
            break
        text = wrapped.group(1)
    text = aliases.get(text, text)
    if text.startswith("Vec<("):
        return True
    if not text.startswith("("):
        return False
    depth, fields = 0, 1
    for c in text[1:-1]:
        depth += {"(": 1, "<": 1, "[": 1, ")": -1, ">": -1, "]": -1}.get(c, 0)
        fields += c == "," and depth == 0
    return fields >= 3


def python_entry_points(code: str) -> list[tuple[int, str, str]]:
    """(line, name, return type) of each `#[pyfunction]` and each fn of a `#[pymethods]` impl."""
    starts = [m.end() for m in re.finditer(r"#\[pyfunction\]", code)]
    for impl in re.finditer(r"#\[pymethods\][^{]*\{", code):
        body = code[impl.end():closing_brace(code, impl.end() - 1)]
        starts += [impl.end() + m.start() for m in re.finditer(r"\bfn\s+\w+", body)]
    found = []
    for start in starts:
        fn = re.compile(r"\bfn\s+(\w+)").search(code, start)
        if not fn:
            continue
        i, depth = fn.end(), 0
        while i < len(code) and not (depth == 0 and code[i] in "{;"):
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        returns = code[fn.end():i].partition("->")[2].split(" where ")[0]
        found.append((code.count("\n", 0, fn.start()) + 1, fn.group(1), returns))
    return found


def test_no_record_crosses_from_the_core_as_a_tuple():
    """Records cross as frozen row classes with named fields (src/bindings/rows.rs), never as
    positional tuples that every caller unpacks by position: checked in the stub and in the
    bindings' Python entry points. Pairs (an array and its counts) stay pairs, and a row's field
    may list pairs (each rank's messages and bytes)."""
    problems = []
    stub = ast.parse((PACKAGE / "_core.pyi").read_text())
    for node in ast.walk(stub):
        field = isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)
        if isinstance(node, ast.FunctionDef) and row_annotation(node.returns, not field):
            problems.append(f"_core.pyi:{node.lineno} {node.name} returns a row as a tuple")
    entry_points = 0
    for path in sorted((SRC / "bindings").rglob("*.rs")):
        code = strip_rust(path.read_text())
        aliases = {m.group(1): re.sub(r"\s+", "", m.group(2))
                   for m in re.finditer(r"\btype\s+(\w+)\s*=\s*([^;]+);", code)}
        for line, name, returns in python_entry_points(code):
            entry_points += 1
            if rust_row_type(returns, aliases):
                problems.append(f"{rel(path)}:{line} {name} returns a row as a tuple")
    assert entry_points > 50, "the reader finds the bindings' functions"
    assert not problems, "\n".join(problems)


# Rust. The crate's top-level modules, bottom to top; a module may use only the modules on the
# rows below its own (never one on its own row). `lib.rs` only declares them.
LAYERS = layer_table("rust")
ALLOWED = {
    module: {m for row in LAYERS[:level] for m in row} | {module}
    for level, row in enumerate(LAYERS)
    for module in row
}
BINDINGS_MAY_USE = {"runtime", "error", "bindings"}
"""The bindings reach the core only through the runtime (and raise its errors)."""


# --- A small reader of Rust sources: comments and literals out, then paths resolved. ---

_LEXEME = re.compile(
    r"//[^\n]*"  # a line comment
    r"|/\*|\*/"  # a block comment's ends (they nest)
    r"|(?<![\w])b?r(#*)\"(?:.|\n)*?\"\1"  # a raw string
    r"|b?\"(?:\\.|[^\"\\])*\""  # a string
    r"|'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^'\\\n])'",  # a char; not a 'lifetime
    re.DOTALL,
)


def strip_rust(text: str) -> str:
    """The code alone: comments dropped, string and char literals emptied; newlines kept, so a
    position still has its line number."""
    out: list[str] = []
    pos, depth, comment_from = 0, 0, 0
    for match in _LEXEME.finditer(text):
        lexeme = match.group(0)
        if depth:  # inside a block comment only its ends count
            depth += {"/*": 1, "*/": -1}.get(lexeme, 0)
            if not depth:
                out.append(" " + "\n" * text.count("\n", comment_from, match.end()))
                pos = match.end()
            continue
        if lexeme == "*/":
            continue
        out.append(text[pos : match.start()])
        pos = match.end()
        if lexeme == "/*":
            depth, comment_from = 1, match.start()
        elif lexeme.startswith("//"):
            pass
        elif lexeme.endswith("'"):
            out.append("' '")
        else:
            out.append('""' + "\n" * lexeme.count("\n"))
    out.append(text[pos:] if not depth else "")
    return "".join(out)


def closing_brace(code: str, opening: int) -> int:
    depth = 0
    for i in range(opening, len(code)):
        depth += {"{": 1, "}": -1}.get(code[i], 0)
        if depth == 0:
            return i
    return len(code) - 1


def blank(code: str, start: int, end: int) -> str:
    return code[:start] + re.sub(r"[^\n]", " ", code[start:end]) + code[end:]


_INLINE_MOD = re.compile(r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*\{")


def scopes(code: str, modpath: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """(code, module path) per module the text holds: the file's own, then each inline `mod x { }`
    (where `super` means the file's module). `#[cfg(test)]` modules are left out: a unit test
    module inside a file is no sibling of anything."""
    found = []
    outer, pos = code, 0
    while match := _INLINE_MOD.search(code, pos):
        end = closing_brace(code, match.end() - 1) + 1
        outer = blank(outer, match.start(), end)
        if "cfg(test)" not in re.sub(r"\s", "", match.group(1)):
            body = blank(blank(code, 0, match.end()), end - 1, len(code))
            found += scopes(body, (*modpath, match.group(2)))
        pos = end
    return [(outer, modpath), *found]


def use_paths(tree: str) -> list[tuple[list[str], str]]:
    """`a::{b, c::{self, d as e}}` -> ([a, b], b), ([a, c], c), ([a, c, d], e): each path and the
    name it brings into scope."""
    tokens = re.findall(r"::|[{},*]|\w+", tree)
    paths: list[tuple[list[str], str]] = []

    def tree_at(i: int, prefix: list[str]) -> int:
        path = list(prefix)
        if i < len(tokens) and tokens[i] == "::" and not path:
            path.append("")
            i += 1
        while i < len(tokens) and tokens[i] not in (",", "}"):
            token = tokens[i]
            if token == "{":
                i += 1
                while i < len(tokens) and tokens[i] != "}":
                    i = tree_at(i, path)
                    i += tokens[i] == "," if i < len(tokens) else 0
                return i + 1
            if token == "as":
                paths[-1] = (paths[-1][0], tokens[i + 1])
                i += 2
                continue
            if token != "::" and not (token == "self" and path):
                path.append(token)
                if i + 1 >= len(tokens) or tokens[i + 1] in (",", "}", "as"):
                    paths.append((path, path[-1]))
            elif token == "self" and (i + 1 >= len(tokens) or tokens[i + 1] in (",", "}", "as")):
                paths.append((path, path[-1]))
            i += 1
        return i

    i = 0
    while i < len(tokens):
        i = tree_at(i, []) + 1
    return paths


def module_path(path: Path) -> tuple[str, ...]:
    parts = path.relative_to(SRC).with_suffix("").parts
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def child_modules(path: Path) -> dict[str, Path]:
    """The modules in the folder a root file (`lib.rs`, `x/mod.rs` or `x.rs` beside `x/`) owns."""
    folder = path.parent if path.stem in ("lib", "mod") else path.with_suffix("")
    if not folder.is_dir():
        return {}
    found = {p.stem: p for p in folder.glob("*.rs") if p.stem not in ("lib", "mod")}
    for sub in folder.iterdir():
        if sub.is_dir() and (sub / "mod.rs").exists():
            found[sub.name] = sub / "mod.rs"
    return found


_USE = re.compile(r"(?<![\w:])use\s+([^;]+);")
_CODE_PATH = re.compile(r"(?<![\w:])(::\s*)?(\w+(?:\s*::\s*\w+)+)")
_KEYWORDS = {"crate", "super", "self"}


class Ref:
    """A path a file names: `target` is where it leads from the crate root (`("crate", ...)`) or
    outside the crate (`("extern", ...)`, e.g. `("extern", "mpi", "ffi")`)."""

    def __init__(self, line: int, text: str, target: tuple[str, ...]):
        self.line, self.text, self.target = line, text, target

    @property
    def internal(self) -> tuple[str, ...] | None:
        return self.target[1:] if self.target[0] == "crate" else None


def resolve(segments: list[str], modpath: tuple[str, ...], names: dict) -> tuple[str, ...]:
    first, rest = segments[0], segments[1:]
    if first == "":
        return ("extern", *rest)
    if first == "crate":
        return ("crate", *rest)
    if first in ("super", "self"):
        here = list(modpath)
        while segments and segments[0] in ("super", "self"):
            if segments.pop(0) == "super":
                here = here[:-1]
        return ("crate", *here, *segments)
    if first in names:
        return (*names[first], *rest)
    return ("extern", *segments)


def rust_refs(path: Path) -> list[Ref]:
    return analyse(path)[0]


def rust_names(path: Path) -> dict[str, tuple[str, ...]]:
    """What each name the file's own module brings into scope (`use`, `mod`) leads to."""
    return analyse(path)[1]


@functools.cache
def analyse(path: Path) -> tuple[list[Ref], dict[str, tuple[str, ...]]]:
    """Every path the file names outside its `#[cfg(test)]` modules: in `use` items (groups
    expanded) and in code, each resolved through the file's own `use`s and `mod`s."""
    code = strip_rust(path.read_text())
    own_names: dict[str, tuple[str, ...]] = {}
    newlines = [i for i, c in enumerate(code) if c == "\n"]
    refs: list[Ref] = []
    for text, modpath in scopes(code, module_path(path)):
        children = set(re.findall(r"(?<![\w:])mod\s+(\w+)\s*[;{]", text))
        if modpath == module_path(path):  # the file's own module: its folder holds its children
            children |= set(child_modules(path))
        names = {child: ("crate", *modpath, child) for child in children}
        if modpath == module_path(path):
            own_names = names
        uses = []
        for match in _USE.finditer(text):
            line = bisect.bisect(newlines, match.start()) + 1
            for segments, name in use_paths(match.group(1)):
                uses.append((line, segments, name))
        for line, segments, name in uses:  # `use` items first: later paths may start from them
            target = resolve(list(segments), modpath, names)
            refs.append(Ref(line, "use " + "::".join(segments), target))
            if name not in ("*", "self"):
                names[name] = target
        body = _USE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
        for match in _CODE_PATH.finditer(body):
            segments = re.split(r"\s*::\s*", match.group(2))
            if match.group(1):
                segments.insert(0, "")
            if segments[0] in _KEYWORDS or segments[0] in names or segments[0] == "":
                line = bisect.bisect(newlines, match.start()) + 1
                target = resolve(segments, modpath, names)
                refs.append(Ref(line, "::".join(segments), target))
            elif segments[0][:1].islower():  # a crate by its name: `mpi::is_finalized()`
                line = bisect.bisect(newlines, match.start()) + 1
                refs.append(Ref(line, "::".join(segments), ("extern", *segments)))
    return refs, own_names


def rust_files() -> list[Path]:
    return sorted(SRC.rglob("*.rs"))


def rel(path: Path) -> str:
    """``path`` as the crate's sources name it: "src/...", whichever copy is checked."""
    return str(Path("src") / path.relative_to(SRC))


def top_module(path: Path) -> str:
    return path.relative_to(SRC).with_suffix("").parts[0]


def crate_uses(path: Path) -> dict[str, list[Ref]]:
    """The crate's top-level modules a file names (other than its own), each with where."""
    own = top_module(path)
    used: dict[str, list[Ref]] = {}
    for ref in rust_refs(path):
        if ref.internal and ref.internal[0] != own:
            used.setdefault(ref.internal[0], []).append(ref)
    return used


def where(path: Path, refs: list[Ref]) -> str:
    return "; ".join(f"{rel(path)}:{r.line} {r.text}" for r in refs)


def top_level_modules() -> set[str]:
    return {p.stem for p in SRC.glob("*.rs") if p.stem != "lib"} | {
        d.name for d in SRC.iterdir() if d.is_dir() and any(d.rglob("*.rs"))
    }


def test_the_layer_table_names_every_top_level_module():
    listed = [m for row in LAYERS for m in row]
    assert len(listed) == len(set(listed)), "a module is on two rows of LAYERS"
    assert set(listed) == top_level_modules(), (
        f"LAYERS lists {sorted(set(listed) - top_level_modules())} which src/ lacks, and lacks "
        f"{sorted(top_level_modules() - set(listed))}: give each module of src/ its row"
    )


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_each_rust_module_imports_only_from_below(module):
    files = [p for p in rust_files() if top_module(p) == module]
    assert files, f"no files for the module {module} in src/"
    problems = []
    for path in files:
        for used, refs in sorted(crate_uses(path).items()):
            if used not in ALLOWED[module]:
                problems.append(
                    f"{rel(path)} uses crate::{used}, not below {module} ({where(path, refs)})"
                )
        if module != "bindings" and "pyo3" in strip_rust(path.read_text()):
            problems.append(f"{rel(path)} uses pyo3")
    assert not problems, "\n".join(problems)


def test_lib_rs_only_declares_the_modules():
    code = strip_rust((SRC / "lib.rs").read_text())
    items = [line.strip() for line in code.splitlines() if line.strip()]
    odd = [line for line in items if not re.fullmatch(r"(pub(\([^)]*\))?\s+)?mod\s+\w+\s*;", line)
           and not line.startswith("#")]
    assert not odd, f"src/lib.rs does more than declare modules: {odd}"


def test_lib_rs_points_to_the_layer_table_instead_of_copying_it():
    """The order is written once, in layers.md: lib.rs's doc says where, and describes no layer
    itself (a line of its doc naming two or more top-level modules is a copy)."""
    text = (SRC / "lib.rs").read_text()
    doc = [line for line in text.splitlines() if line.lstrip().startswith("//!")]
    assert any("docs/contributing/layers.md" in line for line in doc), (
        "src/lib.rs's doc should point to docs/contributing/layers.md")
    copies = [line.strip() for line in doc
              if len(set(re.findall(r"`(\w+)`", line)) & top_level_modules()) >= 2]
    assert not copies, "src/lib.rs describes the layers itself:\n" + "\n".join(copies)


# --- Inside a folder: which file uses which sibling. ---

_ITEM = re.compile(r"\b(?:fn|struct|enum|trait|type|const|static|union|macro_rules!)\s+(\w+)")


def rust_folders() -> list[Path]:
    """Every folder of src/ with Rust files: today runtime, transport, schedules, kernels,
    simulate, bindings; tomorrow any other (`src/auto/`)."""
    return sorted(d for d in SRC.rglob("*") if d.is_dir() and any(d.glob("*.rs")))


def folder_root(folder: Path) -> Path | None:
    for root in (folder / "mod.rs", folder.with_suffix(".rs")):
        if root.exists():
            return root
    return None


def sibling_graph(folder: Path) -> dict[Path, dict[Path, list[Ref]]]:
    """file -> sibling file it uses -> where. A file uses a sibling `x.rs` when it names
    `super::x`, `crate::<folder>::x` (in `use`, grouped or not, or in code), or `x::` after a
    `use` of it. It uses the folder's root (mod.rs) only when it names an item defined there
    (a fn, a type, a trait, a const or static; a capitalised name stands for an item the
    root's macros define); an item the root re-exports leads to the file that defines it. The
    root's own `mod x;` declarations, and `#[cfg(test)]` modules' `use super::*`, are no uses."""
    files = {p.stem: p for p in folder.glob("*.rs") if p.stem != "mod"}
    root = folder_root(folder)
    base = module_path(root) if root else (*module_path(folder / "x.rs")[:-1],)
    defined = set(_ITEM.findall(strip_rust(root.read_text()))) if root else set()
    reexported = rust_names(root) if root else {}
    graph: dict[Path, dict[Path, list[Ref]]] = {}
    for path in files.values():
        edges: dict[Path, list[Ref]] = {}
        for ref in rust_refs(path):
            target = ref.internal
            if not target or target[: len(base)] != base or len(target) == len(base):
                continue
            name = target[len(base)]
            if name in files:
                used = files[name]
            elif name in reexported and name not in defined:
                leads = reexported[name]
                inside = leads[0] == "crate" and leads[1 : len(base) + 1] == base
                deeper = inside and len(leads) > len(base) + 1
                used = files.get(leads[len(base) + 1]) if deeper else None
            elif root and (name in defined or name[:1].isupper()):
                used = root
            else:
                used = None
            if used is not None and used != path:
                edges.setdefault(used, []).append(ref)
        graph[path] = edges
    if root is not None and root.parent == folder:
        graph[root] = root_uses(root, files)
    return graph


def declarations(code: str) -> str:
    """A root file's code with only its declarations left: `mod` and `use` items, function
    bodies, static and const initializers, macro definitions and invocations blanked (a facade
    dispatching to its files, and its registries, are no uses); traits, types and signatures
    stay."""
    out = _USE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), code)
    out = re.sub(r"(?<![\w:])(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*;",
                 lambda m: " " * len(m.group(0)), out)
    for fn in re.finditer(r"\bfn\s+\w+|\bmacro_rules!\s*\w+", code):
        i, depth = fn.end(), 0
        while i < len(code) and not (depth == 0 and code[i] in "{;"):
            depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(code[i], 0)
            i += 1
        if i < len(code) and code[i] == "{":
            out = blank(out, i, closing_brace(code, i) + 1)
    for call in re.finditer(r"(?<![\w:])\w+!\s*[(\[{]", code):
        i, depth = call.end() - 1, 0
        while i < len(code):
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(code[i], 0)
            if depth == 0:
                break
            i += 1
        out = blank(out, call.start(), i + 1)
    for item in re.finditer(r"\b(?:static|const)\s+\w+\s*:[^=;{]*=", code):
        i, depth = item.end(), 0
        while i < len(code) and not (depth == 0 and code[i] == ";"):
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(code[i], 0)
            i += 1
        out = blank(out, item.end(), i)
    return out


def root_uses(root: Path, files: dict[str, Path]) -> dict[Path, list[Ref]]:
    """The sibling files a folder's mod.rs names in its declarations (see `declarations`)."""
    base = module_path(root)
    names = rust_names(root)
    code = declarations(scopes(strip_rust(root.read_text()), base)[0][0])
    newlines = [i for i, c in enumerate(code) if c == "\n"]
    edges: dict[Path, list[Ref]] = {}
    for match in re.finditer(r"(?<![\w:])(::\s*)?(\w+(?:\s*::\s*\w+)*)", code):
        segments = re.split(r"\s*::\s*", match.group(2))
        bare = len(segments) == 1
        if segments[0] not in names and segments[0] not in _KEYWORDS:
            continue
        if bare and not segments[0][:1].isupper():
            continue  # a lowercase name alone is a function or a binding, not a module's item
        target = resolve(segments, base, names)
        if target[0] != "crate" or target[1 : len(base) + 1] != base or len(target) < len(base) + 2:
            continue
        used = files.get(target[len(base) + 1])
        if used is not None:
            line = bisect.bisect(newlines, match.start()) + 1
            edges.setdefault(used, []).append(Ref(line, "::".join(segments), target))
    return edges


def shortest_path(graph: dict[Path, dict[Path, list[Ref]]], start: Path, goal: Path):
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, {})):
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        if goal in paths:
            return paths[goal]
        frontier = following
    return None


def cycles(graph: dict[Path, dict[Path, list[Ref]]]) -> list[list[Path]]:
    """For each use that is on a cycle, a shortest such cycle (each cycle once): together they
    show every use that would have to go for the folder to be acyclic."""
    found: dict[frozenset, list[Path]] = {}
    for a in sorted(graph):
        for b in sorted(graph[a]):
            back = shortest_path(graph, b, a)
            if back:
                cycle = [a, *back]
                found.setdefault(frozenset(zip(cycle, cycle[1:])), cycle)
    return sorted(found.values(), key=lambda c: (len(c), c))


@pytest.mark.parametrize("folder", [rel(d) for d in rust_folders()])
def test_no_import_cycle_inside_a_rust_folder(folder):
    graph = sibling_graph(SRC.parent / folder)
    problems = []
    for cycle in cycles(graph):
        steps = [
            f"    {a.name} -> {b.name}: "
            + "; ".join(f"{a.name}:{r.line} {r.text}" for r in graph[a][b][:3])
            for a, b in zip(cycle, cycle[1:])
        ]
        problems.append(" -> ".join(p.name for p in cycle) + "\n" + "\n".join(steps))
    assert not problems, f"import cycles among the files of {folder}/:\n" + "\n".join(problems)


def test_the_sibling_parser_sees_known_uses():
    kernels = sibling_graph(SRC / "kernels")
    assert SRC / "kernels" / "mod.rs" in kernels[SRC / "kernels" / "x86.rs"], "x86.rs uses Order"
    allreduce = SRC / "schedules" / "allreduce"
    schedules = sibling_graph(allreduce)
    ring = allreduce / "ring.rs"
    assert ring in schedules[allreduce / "two_tier.rs"], "use super::ring::..."
    assert ring not in schedules[allreduce / "shared_memory.rs"]
    simulate = sibling_graph(SRC / "simulate")
    assert SRC / "simulate" / "trace.rs" in simulate[SRC / "simulate" / "network.rs"]
    transport = sibling_graph(SRC / "transport")
    shm, root = SRC / "transport" / "shm.rs", SRC / "transport" / "mod.rs"
    assert shm in transport[root], "mod.rs's `trait Transport: shm::Waiter` uses shm.rs"
    assert root not in transport[shm], "shm.rs waits through its own trait"
    bindings = sibling_graph(SRC / "bindings")
    handles = bindings[SRC / "bindings" / "handles.rs"]
    assert {SRC / "bindings" / "buffers.rs", SRC / "bindings" / "errors.rs"} <= set(handles)


def test_the_rust_reader_reads_paths():
    assert use_paths("super::{x, y::{self, z as w}, *}") == [
        (["super", "x"], "x"),
        (["super", "y"], "y"),
        (["super", "y", "z"], "w"),
        (["super", "*"], "*"),
    ]
    assert use_paths("::mpi::ffi") == [(["", "mpi", "ffi"], "ffi")]
    code = strip_rust(
        'let s = "super::a"; // super::b\n/* super::c /* d */ */ let c = \'"\'; super::e'
    )
    assert "super::" in code and code.count("super::") == 1 and code.count("\n") == 1
    found = scopes(strip_rust(
        "use super::a;\nmod inner { use super::b; }\n#[cfg(test)]\nmod tests { use super::*; }"
    ), ("m",))
    assert [modpath for _, modpath in found] == [("m",), ("m", "inner")], "no test module"
    assert "super::a" in found[0][0] and "super::b" not in found[0][0] and "*" not in found[0][0]
    assert "super::b" in found[1][0] and "super::a" not in found[1][0]


# --- Who may name what. ---


def mpi_crate_refs(path: Path) -> list[Ref]:
    return [r for r in rust_refs(path) if r.target[:2] == ("extern", "mpi")]


def test_only_the_transport_names_the_mpi_crate():
    """MPI is a transport: outside src/transport/ no file names the `mpi` crate (`use mpi::..`,
    `mpi::ffi::..`, `::mpi::..`) or its C functions and constants (`ffi::MPI_..`, `ffi::RSMPI_..`).
    ringlet's own `transport::mpi` and `schedules::mpi` are not the crate."""
    problems = []
    for path in rust_files():
        if top_module(path) == "transport":
            continue
        bad = mpi_crate_refs(path)
        code = strip_rust(path.read_text())
        bad += [
            Ref(code.count("\n", 0, m.start()) + 1, m.group(0), ("extern",))
            for m in re.finditer(r"\bffi\s*::\s*(?:MPI_|RSMPI_)\w*", code)
            if not any(r.line == code.count("\n", 0, m.start()) + 1 for r in bad)
        ]
        if bad:
            shown = sorted({(r.line, r.text) for r in bad})
            problems.append(f"{rel(path)} names the mpi crate: " + "; ".join(
                f"{line}: {text}" for line, text in shown[:6]) + (" ..." if len(shown) > 6 else ""))
    assert not problems, "\n".join(problems)


def test_the_mpi_parser_tells_the_crate_from_ringlets_modules():
    assert not mpi_crate_refs(SRC / "schedules" / "mod.rs"), (
        "schedules/mod.rs's registry names its own mpi module (mpi::Mpi), not the crate"
    )
    transport = mpi_crate_refs(SRC / "transport" / "mpi.rs")
    assert any(r.text == "use mpi::ffi" for r in transport), "the parser sees the crate"


def is_module(target: tuple[str, ...]) -> bool:
    """Whether a path from the crate root names a module (a file or a folder of src/)."""
    if target[0] != "crate" or len(target) < 2:
        return False
    place = SRC.joinpath(*target[1:])
    return place.with_suffix(".rs").exists() or (place / "mod.rs").exists()


_PUB_USE = re.compile(r"(?<![\w:])pub(?:\([^)]*\))?\s+use\s+([^;]+);")


def test_the_runtime_re_exports_no_module_of_another_layer():
    """The runtime hands the bindings functions and the types those take and return; a
    re-exported module (`pub use crate::simulate`) would hand them a whole lower layer."""
    problems = []
    for path in sorted((SRC / "runtime").rglob("*.rs")):
        modpath = module_path(path)
        code = scopes(strip_rust(path.read_text()), modpath)[0][0]
        names = dict(rust_names(path))
        for match in _PUB_USE.finditer(code):
            line = code.count("\n", 0, match.start()) + 1
            for segments, _ in use_paths(match.group(1)):
                target = resolve(list(segments), modpath, names)
                if target[:2] != ("crate", "runtime") and is_module(target):
                    problems.append(f"{rel(path)}:{line} re-exports the module "
                                    f"crate::{'::'.join(target[1:])}")
    assert not problems, "\n".join(problems)


def through_the_runtime(ref: Ref) -> tuple[str, ...] | None:
    """The module outside the runtime that a bindings path `crate::runtime::x::...` goes
    through when `x` is the runtime's re-export of that module, or None."""
    target = ref.internal
    if not target or target[0] != "runtime" or len(target) < 3:
        return None
    lead = rust_names(SRC / "runtime" / "mod.rs").get(target[1])
    if not lead or lead[:2] == ("crate", "runtime") or not is_module(lead):
        return None
    return lead


def test_the_bindings_reach_the_core_only_through_the_runtime():
    """Every path is followed through the runtime's re-exports: `runtime::simulate::network`
    is the simulator, not the runtime, whatever its first segment says."""
    files = sorted((SRC / "bindings").rglob("*.rs"))
    assert files
    problems = []
    for path in files:
        for used, refs in sorted(crate_uses(path).items()):
            if used not in BINDINGS_MAY_USE:
                problems.append(f"{rel(path)} uses crate::{used} ({where(path, refs[:3])})")
        for ref in rust_refs(path):
            module = through_the_runtime(ref)
            if module and module[1] not in BINDINGS_MAY_USE:
                problems.append(f"{rel(path)}:{ref.line} {ref.text} uses crate::{module[1]} "
                                f"through the runtime's re-export of a module")
        if "runtime::consistency" in strip_rust(path.read_text()):
            problems.append(f"{rel(path)} uses runtime::consistency")
    assert not problems, "the bindings may use only crate::runtime and crate::error:\n" + "\n".join(
        problems
    )


def test_no_schedule_downcasts_its_transport():
    """A schedule talks to `dyn Transport` only; what a transport can do beyond it goes through
    the trait, never through downcasting to a concrete transport."""
    problems = []
    for path in sorted((SRC / "schedules").rglob("*.rs")):
        code = strip_rust(path.read_text())
        for match in re.finditer(r"\w*downcast\w*|\bas_any\s*\(\s*\)", code):
            line = code.count("\n", 0, match.start()) + 1
            problems.append(f"{rel(path)}:{line} {match.group(0)}")
    assert not problems, "schedules downcast their transport:\n" + "\n".join(problems)


BACK_EDGES = {
    "runtime/call.rs": ("use super::process as _back;", "call.rs -> process.rs"),
    "transport/mpi_shm.rs": ("use super::mpi::MpiTransport as _back;", "mpi_shm.rs -> mpi.rs"),
    "runtime/process.rs": ("use mpi::ffi as _raw;", "src/runtime/process.rs names the mpi crate"),
    "schedules/allreduce/native_mpi.rs": (
        "use mpi::ffi as _raw;", "src/schedules/allreduce/native_mpi.rs names the mpi crate"),
    "schedules/reduce/native_mpi.rs": (
        "fn _raw(t: &dyn std::any::Any) -> bool { t.downcast_ref::<u8>().is_some() }",
        "src/schedules/reduce/native_mpi.rs:1 downcast"),
    "bindings/errors.rs": ("use crate::dtype::DType as _direct;",
                           "src/bindings/errors.rs uses crate::dtype"),
    # shm.rs named the Transport trait, whose `shared()` names shm's SharedMemory.
    "transport/shm.rs": ("use super::Transport as _back;", "mod.rs -> shm.rs -> mod.rs"),
    # The runtime handed the bindings whole modules, and they went through them.
    "runtime/mod.rs": ("pub use crate::{simulate, stats};",
                       "src/runtime/mod.rs:1 re-exports the module crate::simulate"),
    "bindings/mod.rs": ("use crate::runtime::simulate::network::Link as _back;",
                        "uses crate::simulate through the runtime's re-export of a module"),
    "bindings/handles.rs": ("#[pyfunction] fn _row() -> PyResult<(usize, usize, Vec<String>)> {}",
                            "src/bindings/handles.rs:1 _row returns a row as a tuple"),
    "lib.rs": ("//! - [`runtime`]: the collectives; [`worker`]: the queue; [`auto`]: decisions.",
               "src/lib.rs describes the layers itself"),
}
"""Per file of src/: a line that brings back one of the tangles these checks were written
against, and what the failure must say."""

PY_BACK_EDGES = {
    "_allreduce.py": ("from ._runtime import _thread_state",
                      "ringlet._allreduce:1 imports the private name _thread_state of "
                      "ringlet._runtime"),
    "jax/__init__.py": ("from .._collectives import _check_root",
                        "ringlet.jax:1 imports the private name _check_root of "
                        "ringlet._collectives"),
    "calibration.py": (("__all__ = [", "_public = ["), "ringlet.calibration has no __all__"),
    "_core.pyi": (("def group(process_set: int = 0) -> Group:",
                   "def group(process_set: int = 0) -> tuple[int, int, list[str]]:"),
                  "group returns a row as a tuple"),
    "_dtypes.py": ("from . import simulate as _up",
                   "ringlet._dtypes imports ringlet.simulate, which is not below it"),
}
"""The same for the Python package: a line put first, or (old, new) text replaced."""


def put_back(root: Path, edges: dict) -> None:
    for relative, (change, _) in edges.items():
        path = root / relative
        text = path.read_text()
        if isinstance(change, tuple):
            assert change[0] in text, f"{relative} has no {change[0]!r} to put the tangle back in"
            path.write_text(text.replace(change[0], change[1]))
        else:
            path.write_text(change + "\n" + text)


@pytest.mark.skipif("RINGLET_STRUCTURE_SRC" in os.environ, reason="the copy's own run")
def test_the_checks_catch_the_tangles_they_were_written_against(tmp_path):
    """A copy of the sources and of the Python package with each old tangle put back: a runtime
    circle (call -> process), the transport's mpi <-> mpi_shm and mod.rs <-> shm, the mpi
    crate in the runtime and in a schedule, a schedule that downcasts its transport, the
    bindings past the runtime (directly, or through a module the runtime re-exports), a row as
    a tuple (in the bindings and in the stub), lib.rs's own layer list, private names taken
    across modules, a public module without __all__, an import up the Python table. Every one
    is reported; the real tree passes the same checks."""
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy)
    put_back(copy, BACK_EDGES)
    package = tmp_path / "python" / "ringlet"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    put_back(package, PY_BACK_EDGES)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider",
         "-k", "not catch_the_tangles"],
        env={**os.environ, "RINGLET_STRUCTURE_SRC": str(copy),
             "RINGLET_STRUCTURE_PACKAGE": str(package)},
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0, run.stdout
    for relative, (_, reported) in [*BACK_EDGES.items(), *PY_BACK_EDGES.items()]:
        assert reported in run.stdout, f"{relative}: {reported!r} not reported\n{run.stdout}"


def test_ringlet_jax_reaches_the_core_only_through_its_xla_handlers():
    """ringlet.jax is the API for JAX arrays: it checks arguments with the Python API's own
    helpers (and the core's check of an algorithm, when traced) and runs every collective
    through the core's XLA FFI handlers, never through the NumPy bindings (which would copy
    through host arrays outside XLA's order)."""
    modules = python_modules()
    used = set()
    for name in (n for n in modules if n.startswith("ringlet.jax")):
        used |= set(re.findall(r"\b_core\.(\w+)", modules[name].read_text()))
    assert used == {"xla_handlers", "xla_dtypes", "check_algorithm"}, used
