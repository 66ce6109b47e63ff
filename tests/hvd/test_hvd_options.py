"""The same ``DistributedOptimizer`` options through torch, TensorFlow and Keras: the same fused
groups of gradients (Horovod's ``split_list`` for ``groups=<n>``, one group per list and one per
variable listed in none), and the same refusals (exception type and message), whichever
framework is asked.

Each framework's grouping is read where it reduces: torch's buckets (``_buckets``, what its
hooks launch), and the gradients handed to each fused call by TensorFlow's
``DistributedGradientTape`` and by Keras' ``DistributedOptimizer.apply`` (their fused call
replaced by one that records and returns the gradients: only the grouping is tested here, the
reductions themselves by each framework's own tests). Variable k has k + 1 elements, so a
recorded gradient names its variable by its length. The expected groups are written out by
hand, not computed by the code under test. Keras runs on KERAS_BACKEND (TensorFlow unless
set).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

torch = pytest.importorskip("torch")
# A torch optimizer loads torch's LLVM pieces: before TensorFlow's, as the other order aborts
# ("Option 'bitcode-mdindex-threshold' registered more than once").
torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import ringlet.hvd.keras as hvd_keras  # noqa: E402 - after KERAS_BACKEND is set
import ringlet.hvd.keras._backends as keras_backends  # noqa: E402
import ringlet.hvd.tensorflow as hvd_tf  # noqa: E402
import ringlet.hvd.tensorflow._gradients as tf_gradients  # noqa: E402
import ringlet.hvd.torch as hvd_torch  # noqa: E402

# Options whose variables are named by index ("v<k>") are given each framework's own variables.
GROUPINGS = [
    # (variables, options, expected groups of variable indices)
    (4, {"groups": 3}, [[0, 1], [2], [3]]),  # ceil-sized chunks would be [[0, 1], [2, 3]]
    (7, {"groups": 3}, [[0, 1, 2], [3, 4], [5, 6]]),  # ceil: [[0, 1, 2], [3, 4, 5], [6]]
    (5, {"groups": 2}, [[0, 1, 2], [3, 4]]),
    (3, {"groups": 5}, [[0], [1], [2]]),  # more groups than variables: the empty ones dropped
    (4, {"num_groups": 3}, [[0, 1], [2], [3]]),  # deprecated, the same as groups
    (4, {"num_groups": 1, "groups": 3}, [[0, 1], [2], [3]]),  # groups wins
    (4, {"groups": [["v3", "v1"]]}, [[3, 1], [0], [2]]),
    (4, {"groups": [["v2"], []]}, [[2], [0], [1], [3]]),
    (3, {"groups": []}, [[0], [1], [2]]),  # listed in none: one group each
]

REFUSALS = [
    ({"groups": -1}, ValueError, "groups should be a non-negative integer or a list of list of "
                                 "variables (torch.Tensor, tf.Variable or keras.Variable)."),
    ({"groups": 0}, ValueError, "groups should be a non-negative integer or a list of list of "
                                "variables (torch.Tensor, tf.Variable or keras.Variable)."),
    ({"groups": "two"}, ValueError, "groups should be a non-negative integer or a list of list "
                                    "of variables (torch.Tensor, tf.Variable or "
                                    "keras.Variable)."),
    ({"num_groups": -2}, ValueError, "groups should be a non-negative integer or a list of list "
                                     "of variables (torch.Tensor, tf.Variable or "
                                     "keras.Variable)."),
    ({"groups": [["v0", "v1"], ["v1"]]}, ValueError,
     "A parameter can only appear once in groups."),
    ({"op": "Sum", "gradient_predivide_factor": 2.0}, ValueError,
     "gradient_predivide_factor not supported with op != Average"),
    ({"gradient_predivide_factor": 0.0}, ValueError,
     "gradient_predivide_factor must not be 0: gradients are scaled by "
     "1 / gradient_predivide_factor before the sum"),
    ({"backward_passes_per_step": 0}, ValueError,
     "backward_passes_per_step must be an integer >= 1, got 0"),
]


def _with_variables(options: dict[str, Any], variables: list[Any]) -> dict[str, Any]:
    """``options`` with "v<k>" replaced by the k-th variable and "Sum" by hvd.Sum."""
    def resolve(value: Any) -> Any:
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if isinstance(value, str) and value.startswith("v") and value[1:].isdigit():
            return variables[int(value[1:])]
        return hvd_torch.Sum if value == "Sum" else value

    return {k: resolve(v) for k, v in options.items()}


def torch_groups(n: int, options: dict[str, Any]) -> list[list[int]]:
    params = [torch.nn.Parameter(torch.zeros(k + 1)) for k in range(n)]
    optimizer = hvd_torch.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                               **_with_variables(options, params))
    return [[p.numel() - 1 for p in bucket] for bucket in optimizer._buckets]


def _recording(calls: list[list[int]]) -> Callable[..., list[Any]]:
    def grouped_allreduce(tensors: list[Any], *args: Any, **kwargs: Any) -> list[Any]:
        calls.append([int(np.prod(tuple(t.shape))) - 1 for t in tensors])
        return list(tensors)

    return grouped_allreduce


def tensorflow_groups(n: int, options: dict[str, Any],
                      monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    calls: list[list[int]] = []
    monkeypatch.setattr(tf_gradients, "grouped_allreduce", _recording(calls))
    variables = [tf.Variable(tf.zeros(k + 1)) for k in range(n)]
    with tf.GradientTape() as tape:
        loss = tf.add_n([tf.reduce_sum(v) for v in variables])
    tape = hvd_tf.DistributedGradientTape(tape, **_with_variables(options, variables))
    tape.gradient(loss, variables)
    return calls


def keras_groups(n: int, options: dict[str, Any],
                 monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    calls: list[list[int]] = []
    monkeypatch.setattr(keras_backends, "grouped_allreduce", _recording(calls))
    variables = [keras.Variable(np.zeros(k + 1, np.float32)) for k in range(n)]
    optimizer = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                               **_with_variables(options, variables))
    optimizer.apply([keras.ops.ones((k + 1,)) for k in range(n)], variables)
    return calls


@pytest.mark.parametrize("n, options, expected", GROUPINGS)
def test_every_framework_fuses_the_same_groups(n, options, expected, monkeypatch):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = {
            "torch": torch_groups(n, options),
            "tensorflow": tensorflow_groups(n, options, monkeypatch),
            "keras": keras_groups(n, options, monkeypatch),
        }
    assert found == dict.fromkeys(found, expected)
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)
                    and "`num_groups` has been replaced by `groups`" in str(w.message)]
    # Horovod's deprecation warning, once per framework, whenever num_groups is given.
    assert len(deprecations) == (3 if options.get("num_groups") else 0)


def _refusal(make: Callable[[], Any]) -> tuple[type, str] | None:
    try:
        make()
    except Exception as exc:  # its type and words are what the test compares
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("options, error, message", REFUSALS)
def test_every_framework_refuses_the_same_options_with_the_same_words(options, error, message):
    params = [torch.nn.Parameter(torch.zeros(k + 1)) for k in range(2)]
    tf_variables = [tf.Variable(tf.zeros(k + 1)) for k in range(2)]
    keras_variables = [keras.Variable(np.zeros(k + 1, np.float32)) for k in range(2)]
    tape_options = {k: v for k, v in options.items() if k != "backward_passes_per_step"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        found = {
            "torch": _refusal(lambda: hvd_torch.DistributedOptimizer(
                torch.optim.SGD(params, lr=0.1), **_with_variables(options, params))),
            "tensorflow 1 optimizer": _refusal(lambda: hvd_tf.DistributedOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(0.1),
                **_with_variables(options, tf_variables))),
            "keras": _refusal(lambda: hvd_keras.DistributedOptimizer(
                keras.optimizers.SGD(0.1), **_with_variables(options, keras_variables))),
        }
        if tape_options:  # the tape has no backward_passes_per_step
            found["tensorflow tape"] = _refusal(lambda: hvd_tf.DistributedGradientTape(
                tf.GradientTape(), **_with_variables(tape_options, tf_variables)))
    assert found == dict.fromkeys(found, (error, message))
