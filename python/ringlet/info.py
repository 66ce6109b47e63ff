"""What ringlet runs on here, and why: ``python -m ringlet.info [--json] [--no-init]``.

Prints ringlet's version, the MPI library it loaded (path, version string, ABI, and why that
one), the launcher it sees, the SIMD level of its reduction kernels, whether the node's shared
memory is available, which of the packages its extras name are installed (``pip install
'ringlet[jax]'`` and the like), and where calibrations are cached. Run it
alone, or under the launcher (``mpirun -n 2 python -m ringlet.info``: rank 0 prints). It
initializes MPI to see shared memory and the ranks (``--no-init`` skips that).
In the spirit of ``horovodrun --check-build`` and ``ompi_info``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import sys
from typing import Any

__all__ = ["DISTRIBUTION", "REQUIRED", "declared", "extras", "gather", "main", "render"]

# The distribution's own name, and what every install needs (no extra).
DISTRIBUTION = "ringlet"
REQUIRED = "required"

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA = re.compile(r"""\bextra\s*==\s*['"]([^'"]+)['"]""")


def declared(requires: list[str] | None = None) -> dict[str, list[str]]:
    """The distributions ringlet depends on, by extra (``REQUIRED`` for those without one):
    pyproject.toml's ``dependencies`` and ``optional-dependencies``, read from the installed
    distribution's metadata (``Requires-Dist``, or ``requires`` if given), so that the list is
    never written twice. Empty when ringlet is not installed as a distribution."""
    if requires is None:
        try:
            requires = importlib.metadata.requires(DISTRIBUTION) or []
        except importlib.metadata.PackageNotFoundError:
            return {}
    extras: dict[str, list[str]] = {}
    for line in requires:
        requirement, _, marker = line.partition(";")
        name = _NAME.match(requirement)
        if name is None:
            continue
        extra = _EXTRA.search(marker)
        names = extras.setdefault(extra[1] if extra else REQUIRED, [])
        if name[1] not in names:
            names.append(name[1])
    return extras


def _version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def extras() -> dict[str, dict[str, str | None]]:
    """For each extra (and ``REQUIRED``), the installed version of each distribution it names,
    else None. Looked up by distribution name in the installed metadata, never imported (torch
    alone takes seconds), so no table maps distributions to the modules they provide (ml-dtypes
    to ml_dtypes, scikit-learn to sklearn, tensorflow-cpu to tensorflow)."""
    return {extra: {name: _version_of(name) for name in names}
            for extra, names in declared().items()}


def gather(initialize: bool = True) -> dict[str, Any]:
    """Everything ``python -m ringlet.info`` prints, as a dict."""
    import ringlet
    from ringlet import _core, _mpi_abi, calibration

    library = _mpi_abi.describe()
    library["version"], library["built_with"] = _core.mpi_library()
    report: dict[str, Any] = {
        "ringlet": ringlet.__version__,
        "python": sys.version.split()[0],
        "mpi": library,
        "launcher": library.pop("launcher"),
        "simd": _core.kernel_level(),
        "extras": extras(),
        "calibration_cache": str(calibration.cache_dir()),
    }
    if initialize:
        ringlet.init()
        shared = _core.shared_memory(0)
        available, why_not = shared.available, shared.reason
        report["rank"] = ringlet.rank()
        report["ranks"] = ringlet.size()
        report["hosts"] = ringlet.topology().hosts
        report["thread_level"] = ringlet.thread_level()
        report["shared_memory"] = {"available": bool(available), "why_not": why_not or None}
    else:
        report["shared_memory"] = None
    return report


def render(report: dict[str, Any]) -> str:
    """The report as text, one fact a line."""
    mpi, launcher = report["mpi"], report["launcher"]
    lines = [
        f"ringlet            {report['ringlet']} (Python {report['python']})",
        f"core               {mpi['core']} ({mpi['build']})",
        f"MPI library        {mpi['library']}"
        + (f" -> {mpi['library_file']}" if mpi["library_file"] != mpi["library"] else ""),
        f"MPI ABI            {mpi['abi']} (core built with {mpi['built_with']})",
        f"MPI version        {mpi['version'].splitlines()[0] if mpi['version'] else '?'}",
        f"chosen by          {mpi['chosen_by']}",
    ]
    lines += [f"  before that      {line}" for line in mpi["tried"]]
    if len(mpi["loaded"]) > 1:
        lines.append(f"WARNING            {len(mpi['loaded'])} MPI libraries are loaded: "
                     + ", ".join(mpi["loaded"]))
    lines.append("launcher           " + (
        "none (a job of one; start ranks with mpirun, mpiexec or srun)" if launcher is None
        else f"{launcher['name']}" + (f" ({launcher['program']})" if launcher["program"] else "")))
    if "ranks" in report:
        lines.append(f"ranks              {report['ranks']} on {len(set(report['hosts']))} "
                     f"host(s), thread level {report['thread_level']}")
    shm = report["shared_memory"]
    lines.append("shared memory      " + (
        "not checked (--no-init)" if shm is None
        else "available" if shm["available"] else f"not available: {shm['why_not']}"))
    lines.append(f"SIMD kernels       {report['simd']}")
    if not report["extras"]:
        lines.append(f"packages           unknown: no metadata of the {DISTRIBUTION} distribution")
    for extra, packages in report["extras"].items():
        label = "packages" if extra == REQUIRED else f"  [{extra}]"
        lines.append(f"{label:<19}" + ", ".join(
            f"{name} {version}" if version else f"{name} (not installed)"
            for name, version in packages.items()))
    lines.append(f"calibration cache  {report['calibration_cache']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ringlet.info",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-init", action="store_true",
                        help="do not initialize MPI (no ranks, hosts or shared memory)")
    args = parser.parse_args(argv)
    try:
        report = gather(initialize=not args.no_init)
    except ImportError as error:
        # No MPI, or a broken install: the loader's message says what was tried.
        print(f"ringlet cannot load: {error}", file=sys.stderr)
        return 1
    if report.get("rank", 0) != 0:
        return 0  # under a launcher, rank 0 speaks for the job
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
