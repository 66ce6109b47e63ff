"""tests/ is laid out by subject and mapped by tests/README.md: every folder that holds tests
has its row there, no test file name is used twice, and no conftest copies or loads another
(the MPI suites share tests/mpi_fixtures.py as a plugin)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# Vendored upstream files (Horovod's own tests) keep their names: they are not ours to rename.
VENDORED = TESTS / "hvd" / "upstream"


def files_of_tests() -> list[Path]:
    found = [*TESTS.rglob("test_*.py"), *(TESTS / "core").glob("*.rs")]
    return sorted(p for p in found if "__pycache__" not in p.parts)


def test_no_test_file_name_is_used_twice():
    names = Counter(p.name for p in files_of_tests())
    assert names["test_layers.py"] == 1, "the walk sees the tests"
    twice = {name: [str(p.relative_to(TESTS)) for p in files_of_tests() if p.name == name]
             for name, n in names.items() if n > 1}
    assert not twice, f"test file names used more than once: {twice}"


def test_every_folder_of_tests_has_its_row_in_the_map():
    readme = (TESTS / "README.md").read_text()
    rows = set(re.findall(r"^\| `([^`]+)/`", readme, re.M))
    rows |= {m for line in readme.splitlines() if line.startswith("| ")
             for m in re.findall(r"`([a-z_/]+)/`", line.split("|")[1])}
    assert "collectives" in rows, "the parser sees the table"
    folders = {str(p.parent.relative_to(TESTS)) for p in files_of_tests()
               if p.parent != TESTS and not p.is_relative_to(VENDORED)}
    # A folder is mapped by its own row or by its parent's (hvd/torch by `hvd/torch/`).
    missing = sorted(f for f in folders
                     if not any(f == row or f.startswith(row + "/") for row in rows))
    assert not missing, f"folders of tests missing from tests/README.md: {missing}"


def test_no_conftest_loads_another_file():
    loaders = re.compile(r"spec_from_file_location|exec_module|exec\(|runpy")
    copying = [str(p.relative_to(TESTS)) for p in TESTS.rglob("conftest.py")
               if loaders.search(p.read_text())]
    assert not copying, f"conftests that load another file (use tests/mpi_fixtures.py): {copying}"
