"""Gradients reduced over the ranks: ``DistributedGradientTape`` (TensorFlow 2) and
``DistributedOptimizer`` (TensorFlow 1 optimizers; Keras optimizers are ``ringlet.hvd.keras``'s)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

import ringlet

from .._ops import Average, Compression
from .._options import OptimizerOptions, grouped, optimizer_options
from .._process_sets import global_process_set, ringlet_set, set_size
from ._collectives import allreduce, check_op, grouped_allreduce

__all__ = ["DistributedGradientTape", "DistributedOptimizer", "PartialDistributedGradientTape"]


def _reduce_gradients(grads: list[Any], sources: list[Any], options: OptimizerOptions,
                      process_set: Any) -> list[Any]:
    """The gradients reduced over the ranks: dense ones fused, one call per group of
    ``options.groups`` (default: all of them), sparse ones by allgather; None stays None."""
    if options.sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                 for g in grads]
    chosen = ringlet_set(process_set)
    if chosen is not None and (ringlet.rank() not in chosen.ranks or len(chosen.ranks) == 1):
        return list(grads)  # Horovod's _allreduce_cond: nothing to reduce with
    op = options.op
    reduced: list[Any] = list(grads)
    dense = [i for i, g in enumerate(grads)
             if g is not None and not isinstance(g, tf.IndexedSlices)]
    for i, g in enumerate(grads):
        if isinstance(g, tf.IndexedSlices):
            reduced[i] = allreduce(g, op=op, process_set=process_set)
    for group in grouped(dense, options.groups, lambda i: sources[i]):
        out = grouped_allreduce([grads[i] for i in group], op=op,
                                compression=options.compression,
                                prescale_factor=options.prescale,
                                postscale_factor=options.postscale, process_set=process_set)
        for i, r in zip(group, out):
            reduced[i] = r
    return reduced


def _checked_options(op: Any, gradient_predivide_factor: float, backward_passes_per_step: int,
                     num_groups: int, groups: Any, compression: Any,
                     sparse_as_dense: bool) -> OptimizerOptions:
    """The op checked as every collective checks it, then the options every framework's
    ``DistributedOptimizer`` checks alike."""
    return optimizer_options(
        op=check_op(None, op), gradient_predivide_factor=gradient_predivide_factor,
        backward_passes_per_step=backward_passes_per_step, num_groups=num_groups,
        groups=groups, compression=compression, sparse_as_dense=sparse_as_dense, stacklevel=4)


def _key(source: Any) -> Any:
    """A hashable identity of a variable (TensorFlow's, or Keras 3's, which has no ref())."""
    ref = getattr(source, "ref", None)
    return ref() if ref is not None else id(source)


class _DistributedGradientTape:
    """The methods a wrapped tape gets (its class stays the original tape's)."""

    def _setup(self, options: OptimizerOptions, process_set: Any,
               scale_local_gradients: bool) -> None:
        self._ringlet = (options, process_set)
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._local_sources: set[Any] = set()

    def register_local_source(self, source: Any) -> None:
        """Leave this source's gradient unreduced (scaled by 1/size if
        ``scale_local_gradients``)."""
        self._local_sources.add(_key(source))

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 use_generic_names: bool = False) -> Any:
        gradients = super(self.__class__, self).gradient(target, sources, output_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat = tf.nest.flatten(gradients, expand_composites=False)
        options, process_set = self._ringlet
        shared = [i for i, s in enumerate(flat_sources) if _key(s) not in self._local_sources]
        reduced = _reduce_gradients([flat[i] for i in shared], [flat_sources[i] for i in shared],
                                    options, process_set)
        result = list(flat)
        for i, r in zip(shared, reduced):
            result[i] = r
        if self.scale_local_gradients and self._local_sources:
            size = float(set_size(process_set))
            for i, s in enumerate(flat_sources):
                g = result[i]
                if _key(s) in self._local_sources and g is not None:
                    result[i] = (tf.IndexedSlices(g.values / size, g.indices, g.dense_shape)
                                 if isinstance(g, tf.IndexedSlices) else g / size)
        return tf.nest.pack_sequence_as(sources, result)

    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None,
                                       use_generic_names: bool = False) -> Any:
        gradients = self.gradient(target, sources, output_gradients)
        local, shared = [], []
        for s, g in zip(sources, gradients):
            (local if _key(s) in self._local_sources else shared).append((s, g))
        return local, shared


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression: Any = Compression.none,
                            sparse_as_dense: bool = False, op: Any = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None, process_set: Any = global_process_set,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """``gradtape`` whose ``gradient()`` returns the gradients averaged (``op``) over the
    ranks: every dense gradient in one fused reduction (or one per group of ``groups``)."""
    options = _checked_options(op, gradient_predivide_factor, 1, num_groups, groups,
                               compression, sparse_as_dense)
    ringlet_set(process_set)
    methods = {k: v for k, v in vars(_DistributedGradientTape).items()
               if not k.startswith("__")}
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,), methods)
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the same recording tape, now reducing
    tape._setup(options, process_set, scale_local_gradients)
    return tape


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "", compression: Any = Compression.none,
                                   sparse_as_dense: bool = False, op: Any = Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: Any = None, process_set: Any = global_process_set,
                                   local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """``DistributedGradientTape`` whose ``local_layers``' variables keep their local
    gradients."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    layers = [] if local_layers is None else (
        local_layers if isinstance(local_layers, (list, tuple)) else [local_layers])
    for layer in layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A TensorFlow 1 optimizer whose ``compute_gradients`` reduces the gradients."""

    def __init__(self, optimizer: Any, name: Any, use_locking: bool, options: OptimizerOptions,
                 process_set: Any) -> None:
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}",
                         use_locking=use_locking)
        self._optimizer = optimizer
        self._ringlet = (options, process_set)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> Any:
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = zip(*pairs) if pairs else ((), ())
        reduced = _reduce_gradients(list(grads), list(variables), *self._ringlet)
        return list(zip(reduced, variables))

    def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer: Any, name: Any = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "",
                         compression: Any = Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: Any = Average,
                         gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: Any = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """Wrap a TensorFlow 1 optimizer (``tf.compat.v1.train.Optimizer``) so that its
    gradients are reduced over the ranks. A Keras optimizer is ``ringlet.hvd.keras``'s to wrap
    (``ringlet.hvd.tensorflow.keras.DistributedOptimizer``): a TypeError says so."""
    options = _checked_options(op, gradient_predivide_factor, backward_passes_per_step,
                               num_groups, groups, compression, sparse_as_dense)
    ringlet_set(process_set)
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError(
            f"hvd.DistributedOptimizer here wraps TensorFlow 1 optimizers "
            f"(tf.compat.v1.train.Optimizer); got {type(optimizer).__module__}."
            f"{type(optimizer).__name__}. For a Keras optimizer use "
            "ringlet.hvd.tensorflow.keras.DistributedOptimizer (or ringlet.hvd.keras's), or "
            "hvd.DistributedGradientTape in a custom training step")
    if backward_passes_per_step != 1:
        raise NotImplementedError("backward_passes_per_step > 1 is supported for Keras "
                                  "optimizers (ringlet.hvd.keras), not TensorFlow 1's")
    return _DistributedOptimizer(optimizer, name, use_locking, options, process_set)


