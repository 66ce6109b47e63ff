"""examples/tf_train_digits.py at this rank count: its --check trains with
DistributedGradientTape, then requires bit-identical weights on every rank, a single process's
training on the global batches (within float tolerance), and a test accuracy above 0.95; it
exits 1 otherwise."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tf_train_digits.py"


def test_the_tensorflow_example_trains_the_same_weights_as_one_process(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("tf_train_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--check"])
    try:
        example.main()
    except SystemExit as exit:
        pytest.fail(f"tf_train_digits.py --check exited with {exit.code}: "
                    f"{capsys.readouterr().err}")
    import ringlet

    if ringlet.rank() == 0:
        assert "check passed: weights bit-identical" in capsys.readouterr().out
