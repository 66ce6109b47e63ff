"""``DistributedOptimizer`` for Keras 3: any ``keras.optimizers.Optimizer``, its gradients
averaged across ranks before it applies them.

As Horovod's, it is a class made on the fly that derives from the optimizer's own class (same
name, same ``get_config``, ``isinstance`` holds), built from the optimizer's config. Keras 3
routes ``apply_gradients`` (TensorFlow's trainer), ``apply`` (PyTorch's) and
``stateless_apply`` (JAX's) through ``apply``, so that is the one method it overrides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras
from keras import ops

import ringlet

from .._ops import Average, Compression, Sum
from .._options import grouped, optimizer_options
from .._process_sets import global_process_set, ringlet_set, set_size
from . import _backends


@dataclass(frozen=True)
class _Options:
    compression: Any = Compression.none
    op: str = "avg"
    prescale: float = 1.0
    postscale: float = 1.0
    passes: int = 1
    average_aggregated: bool = False
    groups: Any = None
    process_set: Any = global_process_set
    scale_local_gradients: bool = True
    name: str | None = None
    sparse_as_dense: bool = False


class _Distributed:
    """Mixed in before the optimizer's class by ``DistributedOptimizer``."""

    _hvd_options: _Options = _Options()
    _ringlet_distributed = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hvd_local_vars: set[int] = set()
        self._hvd_accumulators: list[Any] = []
        self._hvd_counter: Any = None

    # Horovod's attributes.
    @property
    def process_set(self) -> Any:
        return self._hvd_options.process_set

    @property
    def scale_local_gradients(self) -> bool:
        return self._hvd_options.scale_local_gradients

    def register_local_var(self, var: Any) -> None:
        """Make ``var`` worker-local: its gradient is not reduced (scaled by 1/size if
        ``scale_local_gradients``), as Horovod's."""
        self._hvd_local_vars.add(id(var))

    def build(self, variables: list[Any]) -> None:
        if self.built:
            return
        super().build(variables)
        if self._hvd_options.passes > 1:
            # Local gradient aggregation (backward_passes_per_step): the sums so far, and how
            # many passes they hold. Optimizer variables, so that JAX's stateless steps carry them.
            self._hvd_accumulators = [
                self.add_variable_from_reference(v, name="hvd_aggregated_gradient")
                for v in variables
            ]
            self._hvd_counter = self.add_variable(
                shape=(), dtype="int32", initializer="zeros", name="hvd_backward_passes")

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        if not grads:
            return super().apply(grads, trainable_variables)
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    "When passing `grads` without `variables`, the optimizer must already be "
                    "built on a list of variables. Call `optimizer.build(trainable_variables)` "
                    "first."
                )
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
            if not self.built:  # here, for the aggregation variables; named as Keras does
                with keras.name_scope(self.name):
                    self.build(variables)
        if self._hvd_options.passes == 1:
            return super().apply(self._hvd_allreduce(grads, variables), trainable_variables)
        return self._hvd_aggregate(grads, variables, trainable_variables)

    def _hvd_allreduce(self, grads: list[Any], variables: list[Any]) -> list[Any]:
        """The gradients reduced across the process set, in fused groups; None stays None,
        worker-local variables' gradients stay here (scaled by 1/size, as Horovod)."""
        options = self._hvd_options
        process_set = options.process_set
        if process_set is not global_process_set and not process_set.included():
            return grads  # outside the set: the wrapped optimizer's own step, as Horovod's
        indices = [i for i, (g, v) in enumerate(zip(grads, variables))
                   if g is not None and id(v) not in self._hvd_local_vars]
        chunks = grouped(indices, options.groups, lambda i: variables[i])
        reduced = list(grads)
        for chunk in chunks:
            results = _backends.grouped_allreduce(
                [grads[i] for i in chunk], options.op, options.prescale, options.postscale,
                options.compression, process_set, options.sparse_as_dense)
            for i, result in zip(chunk, results):
                reduced[i] = result
        if self._hvd_local_vars and options.scale_local_gradients:
            size = float(set_size(process_set))
            for i, (g, v) in enumerate(zip(grads, variables)):
                if g is not None and id(v) in self._hvd_local_vars:
                    reduced[i] = g / size
        return reduced

    def _hvd_aggregate(self, grads: list[Any], variables: list[Any],
                       trainable_variables: Any) -> Any:
        """backward_passes_per_step > 1, as Horovod's LocalGradientAggregationHelper: sum the
        gradients locally; every ``passes``-th call reduce the sums (divided by ``passes`` if
        average_aggregated_gradients) and apply them; other calls only count an iteration."""
        options = self._hvd_options
        accumulators = [self._hvd_accumulators[self._get_variable_index(v)] for v in variables]
        summed = [None if g is None else a.value + ops.cast(g, a.dtype)
                  for g, a in zip(grads, accumulators)]
        passes = self._hvd_counter.value + 1
        is_update = ops.greater_equal(passes, options.passes)

        def reduce_sums() -> list[Any]:
            reduced = self._hvd_allreduce(summed, variables)
            if options.average_aggregated:
                reduced = [None if r is None else r / options.passes for r in reduced]
            return reduced

        if _backends.backend() == "torch":  # eager: a Python branch
            if bool(is_update):
                result = super().apply(reduce_sums(), trainable_variables)
                for a in accumulators:
                    a.assign(ops.zeros_like(a.value))
                self._hvd_counter.assign(0)
            else:
                for a, s in zip(accumulators, summed):
                    if s is not None:
                        a.assign(s)
                self._hvd_counter.assign(passes)
                self._iterations.assign_add(1)
                result = None
            return result

        # Traced (jax.jit, tf.function): the collective only on update steps (every rank takes
        # the same branch), the update computed on every step and kept only on update steps
        # (as Keras' own JAX gradient accumulation: no variable writes inside a branch).
        present = [i for i, s in enumerate(summed) if s is not None]
        def reduced_present() -> list[Any]:
            reduced = reduce_sums()
            return [reduced[i] for i in present]

        chosen = ops.cond(is_update, reduced_present, lambda: [summed[i] for i in present])
        to_apply = list(summed)
        for i, value in zip(present, chosen):
            to_apply[i] = value
        kept = [v for v in [*variables, *self.variables]
                if v is not self._iterations and v is not self._hvd_counter
                and all(v is not a for a in self._hvd_accumulators)]
        before = [ops.copy(v.value) for v in kept]
        result = super().apply(to_apply, trainable_variables)  # counts the iteration
        for v, old in zip(kept, before):
            v.assign(ops.where(is_update, v.value, old))
        for a, s in zip(accumulators, summed):
            if s is not None:
                a.assign(ops.where(is_update, ops.zeros_like(s), s))
        self._hvd_counter.assign(ops.where(is_update, ops.zeros_like(passes), passes))
        return result


def _distributed_class(base: type, options: _Options) -> type:
    """``base`` with gradients reduced first: named as ``base`` (and from its module), so that
    a saved model loads with or without ringlet."""
    return type(base.__name__, (_Distributed, base), {
        "_hvd_options": options,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
    })


def _options(compression: Any, sparse_as_dense: bool, gradient_predivide_factor: float, op: Any,
             backward_passes_per_step: int, average_aggregated_gradients: bool, num_groups: int,
             groups: Any, process_set: Any, scale_local_gradients: bool, device_dense: str,
             device_sparse: str, name: str | None) -> _Options:
    """Horovod's checks (same words where it has them), then the options."""
    if op != Average and op != Sum:
        raise ValueError("op currently only supports Average and Sum")
    checked = optimizer_options(
        op=op, gradient_predivide_factor=gradient_predivide_factor,
        backward_passes_per_step=backward_passes_per_step, num_groups=num_groups,
        groups=groups, compression=compression, sparse_as_dense=sparse_as_dense, stacklevel=4)
    for device in (device_dense, device_sparse):
        if device and "cpu" not in device.lower():
            raise ValueError(f"ringlet reduces gradients on the CPU; device {device!r} is not "
                             "supported (leave device_dense and device_sparse empty)")
    _backends.wire_dtype(compression)
    ringlet_set(process_set)  # added, or a clear error now
    return _Options(
        compression=compression,
        op="avg" if op == Average else "sum",
        # Horovod's split of the average around the sum.
        prescale=checked.prescale,
        postscale=checked.postscale,
        passes=checked.passes,
        average_aggregated=bool(average_aggregated_gradients),
        groups=checked.groups,
        process_set=process_set,
        scale_local_gradients=bool(scale_local_gradients),
        name=name,
        # Only TensorFlow's gradients can be sparse (tf.IndexedSlices, of embeddings): densified
        # with it, else allgathered (Horovod's). JAX's and PyTorch's are always dense.
        sparse_as_dense=checked.sparse_as_dense,
    )


def DistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "",
                         device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: Any = Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: Any = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """An optimizer that averages the gradients over all ranks (or ``process_set``'s) before
    applying them: ``optimizer``'s class, rebuilt from its config (as Horovod's).

    Arguments as Horovod's ``horovod.tensorflow.keras.DistributedOptimizer``. ``groups`` (or
    the deprecated ``num_groups``): an integer n reduces the gradients in n fused calls of
    consecutive gradients, a list of lists of variables one call per list (and one per
    variable listed in none); by default one fused call for all of them (ringlet buckets it
    by dtype and size). ``compression``: Compression.none, .fp16 or .bf16. ``device_dense``
    and ``device_sparse``: empty or a CPU device.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a Keras 3 optimizer (an instance of "
                        f"keras.optimizers.Optimizer), got {type(optimizer).__name__}")
    if getattr(optimizer, "_ringlet_distributed", False):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrapping it again "
                         "would reduce every gradient twice")
    options = _options(compression, sparse_as_dense, gradient_predivide_factor, op,
                       backward_passes_per_step, average_aggregated_gradients, num_groups,
                       groups, process_set, scale_local_gradients, device_dense, device_sparse,
                       name)
    ringlet.init()
    cls = _distributed_class(type(optimizer), options)
    return cls.from_config(optimizer.get_config())


def wrapper_class(base: type, compression: Any) -> type:
    """What ``load_model`` puts in place of ``base`` (Horovod's wrap_optimizer): a class whose
    ``from_config`` builds ``base``'s optimizer (Keras may pick its backend's own class, as
    PyTorch's fused Adam) and wraps it in ``DistributedOptimizer``."""

    def from_config(cls: type, config: dict[str, Any], custom_objects: Any = None) -> Any:
        return DistributedOptimizer(base.from_config(config, custom_objects=custom_objects),
                                    compression=compression)

    _backends.wire_dtype(compression)
    return type(base.__name__, (), {"from_config": classmethod(from_config),
                                    "__module__": __name__})


def PartialDistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "",
                                device_sparse: str = "", compression: Any = Compression.none,
                                sparse_as_dense: bool = False,
                                gradient_predivide_factor: float = 1.0, op: Any = Average,
                                backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False, groups: Any = None,
                                process_set: Any = global_process_set, local_layers: Any = None,
                                scale_local_gradients: bool = True) -> Any:
    """``DistributedOptimizer`` whose ``local_layers``' variables keep their own gradients
    (divided by the size if ``scale_local_gradients``), as Horovod's ``horovod.keras``."""
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    elif not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("All local layers must be of keras.layers.Layer type.")
    wrapped = DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients)
    for layer in local_layers:
        for variable in layer.trainable_weights:
            wrapped.register_local_var(variable)
    return wrapped
