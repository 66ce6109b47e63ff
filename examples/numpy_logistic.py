"""Data-parallel training with NumPy only: softmax regression on scikit-learn's digits, with
``ringlet.average_gradients`` averaging the gradients across ranks.

    mpirun -n 2 python examples/numpy_logistic.py

No framework: the gradients are plain NumPy arrays, averaged in place, fused into one buffer.
"""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ringlet


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def main() -> None:
    rank, size = ringlet.rank(), ringlet.size()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    x_train, y_train = x_train[rank::size], y_train[rank::size]
    weights = np.zeros((64, 10), dtype=np.float32)
    bias = np.zeros(10, dtype=np.float32)
    targets = np.eye(10, dtype=np.float32)[y_train]
    for step in range(1, 301):
        probabilities = softmax(x_train @ weights + bias)
        error = (probabilities - targets) / len(x_train)
        grad_w, grad_b = x_train.T @ error, error.sum(axis=0)
        ringlet.average_gradients([grad_w, grad_b])  # in place, one fused allreduce
        weights -= 0.5 * grad_w
        bias -= 0.5 * grad_b
        if step % 100 == 0 and rank == 0:
            accuracy = (np.argmax(x_test @ weights + bias, axis=1) == y_test).mean()
            print(f"step {step}: test accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
