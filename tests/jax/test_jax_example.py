"""examples/jax_train.py at this rank count: its --check trains with ringlet.jax, then requires
bit-identical parameters on every rank and a single process's training on the global batches
(within float tolerance), and a test accuracy of at least 0.9; it exits 1 otherwise."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jax_train.py"


def test_the_jax_example_trains_the_same_parameters_as_one_process(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("jax_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--check", "--epochs", "5"])
    try:
        example.main()
    except SystemExit as exit:
        pytest.fail(f"jax_train.py --check exited with {exit.code}: {capsys.readouterr().err}")
    import ringlet

    if ringlet.rank() == 0:
        assert "check passed: parameters bit-identical" in capsys.readouterr().out
