"""A stand-in for torchvision, for Horovod's elastic synthetic benchmark
(``pytorch_synthetic_benchmark_elastic.py``, next to this folder), which takes its model from
``torchvision.models`` by name. torchvision is not installed: its releases pin one torch each,
and none pins this project's. ``models`` has one small model of torchvision's call signature;
nothing else is imitated."""

from . import models as models
