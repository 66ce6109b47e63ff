"""The layers stay separate: the Python package has no import cycles and the wrappers
(ringlet.hvd, ringlet.jupyter) use only the public API. In the Rust core (read as text: comments
and `#[cfg(test)]` modules left out), each top-level module uses only the modules below it in
LAYERS, no folder's files use each other in a cycle, only src/transport/ names the `mpi` crate,
the bindings reach the core through the runtime alone, and no schedule downcasts its transport."""

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
PACKAGE = ROOT / "python" / "ringlet"
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
            # ringlet.jax is the public API for JAX arrays (ringlet.hvd.keras's JAX backend).
            assert imported in ("ringlet", "ringlet.run", "ringlet.jax") or \
                imported.split(".")[:2] == own, (
                f"{name} imports {imported}, which is not ringlet's public API"
            )
        assert "_core" not in path.read_text(), f"{name} touches ringlet._core"


# Rust. The crate's top-level modules, bottom to top; a module may use only the modules on the
# rows below its own (never one on its own row). `lib.rs` only declares them.
LAYERS = [
    {"error"},
    {"dtype"},
    {"worker", "scratch", "stats"},
    {"transport", "kernels"},
    {"schedules"},
    {"probe", "auto"},
    {"simulate"},
    {"runtime"},
    {"bindings"},
]
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
    return graph


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


def test_the_bindings_reach_the_core_only_through_the_runtime():
    files = sorted((SRC / "bindings").rglob("*.rs"))
    assert files
    problems = []
    for path in files:
        for used, refs in sorted(crate_uses(path).items()):
            if used not in BINDINGS_MAY_USE:
                problems.append(f"{rel(path)} uses crate::{used} ({where(path, refs[:3])})")
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
}
"""Per file: a line that brings back one of the tangles these checks were written against,
and what the failure must say."""


@pytest.mark.skipif("RINGLET_STRUCTURE_SRC" in os.environ, reason="the copy's own run")
def test_the_checks_catch_the_tangles_they_were_written_against(tmp_path):
    """A copy of the sources with each old tangle put back: a runtime circle (call -> process),
    the transport's mpi <-> mpi_shm, the mpi crate in the runtime and in a schedule, a schedule
    that downcasts its transport, the bindings past the runtime. Every one is reported; the
    real tree passes the same checks."""
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy)
    for relative, (line, _) in BACK_EDGES.items():
        path = copy / relative
        path.write_text(line + "\n" + path.read_text())
    run = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider",
         "-k", "not catch_the_tangles"],
        env={**os.environ, "RINGLET_STRUCTURE_SRC": str(copy)}, cwd=ROOT,
        capture_output=True, text=True, timeout=300)
    assert run.returncode != 0, run.stdout
    for relative, (_, reported) in BACK_EDGES.items():
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
