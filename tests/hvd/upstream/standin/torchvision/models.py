"""``torchvision.models``' one stand-in model (see the package's docstring)."""

from __future__ import annotations

from torch import nn


def tiny_convnet(num_classes: int = 1000) -> nn.Module:
    """Images (N, 3, 224, 224) to ``num_classes`` logits: two convolutions, then a linear
    layer, half a million parameters (ResNet-50 has 25 M), so that eight ranks on two cores step
    in a fraction of a second."""
    return nn.Sequential(
        nn.Conv2d(3, 16, kernel_size=8, stride=4), nn.ReLU(),
        nn.Conv2d(16, 32, kernel_size=4, stride=4), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        nn.Linear(32 * 16, num_classes),
    )
