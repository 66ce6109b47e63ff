"""Print a key naming the MPI that a build of ringlet would compile and link against.

    python3 tools/mpi_build_key.py            # e.g. openmpi-1a2b3c4d, mpich-5e6f7a8b
    python3 tools/mpi_build_key.py --verbose  # also says, on stderr, how it was found

The build keeps its cargo target directory in target/mpi/<key> (the Makefile, and the PEP 517
backend in tools/ringlet_build_backend.py), so a build against one MPI never reuses what was
built against another: rsmpi's mpi-sys build script probes MPI only when its own files change,
so a shared target directory would link the first MPI's libmpi with a shim compiled for the
second.

The MPI is resolved as build-probe-mpi 0.1.6 (mpi-sys's build script) resolves it:
$MPI_PKG_CONFIG (pkg-config, alone if set); $CRAY_MPICH_DIR/lib/pkgconfig/mpich.pc; $MPICC, else
`mpicc`, through `-show`; pkg-config `mpich`; pkg-config `ompi`. The key is a readable flavor
and a hash of what was found: the wrapper's real path, its `-show` output and its version line
(or the pkg-config module's flags and version).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

# Markers in a wrapper's version output, and the flavor each names; the first that matches wins.
FLAVORS = (
    ("Open MPI", "openmpi"),
    ("OpenRTE", "openmpi"),
    ("MVAPICH", "mvapich"),
    ("Intel(R) MPI", "intelmpi"),
    ("MPICH", "mpich"),
)


def run(command: list[str], env: Mapping[str, str]) -> tuple[int, str] | None:
    """(exit code, stdout + stderr) of `command`, or None if it cannot be started."""
    try:
        completed = subprocess.run(command, env=dict(env), stdin=subprocess.DEVNULL,
                                   capture_output=True, text=True, errors="replace", timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.returncode, completed.stdout + completed.stderr


def flavor_of(text: str) -> str | None:
    for marker, flavor in FLAVORS:
        if marker in text:
            return flavor
    return None


def version_line(text: str) -> str:
    return next((line for line in text.splitlines() if flavor_of(line)), "")


def probe_wrapper(mpicc: str, env: Mapping[str, str]) -> tuple[str, list[str]] | None:
    """(flavor, identity) of an MPI compiler wrapper; None if it cannot be run (as mpi-sys
    then falls back to pkg-config; a wrapper that runs but fails is still taken, as there)."""
    path = shutil.which(mpicc, path=env.get("PATH", os.defpath))
    if path is None:
        return None
    show = run([path, "-show"], env)
    if show is None:
        return None
    version = ""
    for argument in ("-showme:version", "-v"):  # Open MPI; MPICH, MVAPICH, Intel MPI
        answer = run([path, argument], env)
        version = version_line(answer[1]) if answer else ""
        if version:
            # "mpicc.openmpi: Open MPI 4.1.4" is "mpicc: Open MPI 4.1.4" under another name.
            version = version.replace(os.path.basename(path), "mpicc")
            break
    flavor = flavor_of(version)
    if flavor is None:
        flavor = "mpich" if "-lmpich" in show[1] else "mpi"
    return flavor, ["wrapper", os.path.realpath(path), show[1], version]


def probe_pkg_config(module: str, env: Mapping[str, str]) -> tuple[str, list[str]] | None:
    """(flavor, identity) of a pkg-config module (a name or a .pc file), or None."""
    pkg_config = env.get("PKG_CONFIG", "pkg-config")
    answers = [run([pkg_config, option, module], env)
               for option in ("--modversion", "--cflags", "--libs")]
    if any(answer is None or answer[0] != 0 for answer in answers):
        return None
    name = Path(module).name.lower()
    text = " ".join(answer[1] for answer in answers if answer)
    if "mpich" in name or "-lmpich" in text:
        flavor = "mpich"
    elif "ompi" in name or "openmpi" in name or "openmpi" in text:
        flavor = "openmpi"
    else:
        flavor = "mpi"
    where = os.path.realpath(module) if os.sep in module else module
    return flavor, ["pkg-config", where, *(answer[1] for answer in answers if answer)]


def resolve(env: Mapping[str, str] | None = None) -> tuple[str, list[str]] | None:
    """(flavor, identity) of the MPI the build would use, in build-probe-mpi's order."""
    env = os.environ if env is None else env
    if env.get("MPI_PKG_CONFIG"):
        # build-probe-mpi uses this alone when it is set (and fails if it is invalid).
        return probe_pkg_config(env["MPI_PKG_CONFIG"], env)
    if env.get("CRAY_MPICH_DIR"):
        pc = os.path.join(env["CRAY_MPICH_DIR"], "lib", "pkgconfig", "mpich.pc")
        found = probe_pkg_config(pc, env)
        if found:
            return "cray-mpich", found[1]
    return (probe_wrapper(env.get("MPICC") or "mpicc", env)
            or probe_pkg_config("mpich", env)
            or probe_pkg_config("ompi", env))


def build_key(env: Mapping[str, str] | None = None) -> str:
    """`<flavor>-<8 hex digits>`; `none-<...>` if no MPI is found (the build then fails and
    says why)."""
    found = resolve(env)
    flavor, identity = found if found else ("none", [])
    digest = hashlib.sha256("\0".join(identity).encode()).hexdigest()[:8]
    return f"{flavor}-{digest}"


def target_dir(project: Path, env: Mapping[str, str] | None = None) -> Path:
    """The cargo target directory of a build against the MPI `env` leads to."""
    return project / "target" / "mpi" / build_key(env)


def main(argv: list[str]) -> int:
    if argv not in ([], ["--verbose"], ["-v"]):
        print(__doc__.strip().splitlines()[0], "\nusage: mpi_build_key.py [--verbose]",
              file=sys.stderr)
        return 2
    if argv:
        found = resolve()
        print(f"mpi_build_key: {found[0]} from {found[1][:2]}" if found
              else "mpi_build_key: no MPI found", file=sys.stderr)
    print(build_key())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
