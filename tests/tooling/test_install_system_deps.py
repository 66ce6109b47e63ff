"""tools/install_system_deps.sh --check: where it finds libclang and MPI, and what it asks for.

Each test runs the script with an empty fake root (RINGLET_SYSROOT, which prefixes the system
library directories searched) and a PATH holding nothing but a directory of fake tools (`#!/bin/sh`
scripts that print what the real ones print). A `command_not_found_handle` loaded through BASH_ENV
records any other command the script tries to run: the detection must use shell builtins only.
Ordinary pytest, not under mpirun.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "install_system_deps.sh"

# What the real tools print (Debian 12: Open MPI 4.1.4, MPICH 4.0.2), per argument the script
# passes; any other argument fails the way the real tool does. test_fakes_match_the_real_tools
# compares these with the installed tools.
GCC_VERSION = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"
OPENMPI_MPICC = {
    "-showme:version": (0, "mpicc: Open MPI 4.1.4 (Language: C)"),
    "-show": (0, "gcc -I/usr/lib/x86_64-linux-gnu/openmpi/include "
                 "-L/usr/lib/x86_64-linux-gnu/openmpi/lib -lmpi"),
    "--version": (0, GCC_VERSION),
    "-v": (0, "Using built-in specs."),
}
OPENMPI_MPIRUN = {
    "--version": (0, "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/"),
    "-showme:version": (1, 'mpirun: Error: option "-h" did not have enough parameters (1)'),
    "-v": (1, "No executable was specified on the mpirun command line."),
}
MPICH_MPICC = {
    "-showme:version": (1, "gcc: error: unrecognized command-line option '-showme:version'"),
    "-show": (0, "gcc -Wl,-z,relro -I/usr/include/x86_64-linux-gnu/mpich "
                 "-L/usr/lib/x86_64-linux-gnu -lmpich"),
    "--version": (0, GCC_VERSION),
    "-v": (0, "mpicc for MPICH version 4.0.2\nUsing built-in specs."),
}
MPICH_MPIRUN = {
    "--version": (0, "HYDRA build details:\n    Version:                                 4.0.2"),
    "-showme:version": (255, "[mpiexec@vm] match_arg (utils/args/args.c:163): "
                             "unrecognized argument showme:version"),
    "-v": (255, "[mpiexec@vm] HYDU_create_proxy_list (utils/alloc/alloc.c:436): "
                "Missing executable."),
}
UNKNOWN_WRAPPER = {"-show": (0, "cc -lmpi"), "--version": (0, "cc 1.0")}

GUARD = """command_not_found_handle() {
    printf '%s\\n' "$1" >>"$RINGLET_TEST_EXTERNAL_LOG"
    return 127
}
"""


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def write_tool(path: Path, responses: dict[str, tuple[int, str]]) -> Path:
    """A `#!/bin/sh` script (builtins only) answering each argument as `responses` says."""
    lines = ["#!/bin/sh", 'case "$1" in']
    for argument, (code, output) in responses.items():
        stream = "" if code == 0 else " >&2"
        lines.append(f"    {shell_quote(argument)}) printf '%s\\n' {shell_quote(output)}{stream};"
                     f" exit {code} ;;")
    lines += ["esac", "printf '%s\\n' \"$0: unsupported arguments: $*\" >&2", "exit 1", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    path.chmod(0o755)
    return path


def write_library(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF")
    return path


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def missing(self) -> list[str]:
        return self.stdout.split()


class Machine:
    """A fake machine: a root tree for the library directories and one bin directory."""

    def __init__(self, base: Path):
        self.base = base
        self.root = base / "root"
        self.bin = base / "bin"
        self.root.mkdir()
        self.bin.mkdir()
        self.external_log = base / "external-commands.log"
        self.guard = base / "guard.bash"
        self.guard.write_text(GUARD)

    def tool(self, name: str, responses: dict[str, tuple[int, str]]) -> Path:
        return write_tool(self.bin / name, responses)

    def library(self, relative: str) -> Path:
        """A file under the fake root, e.g. usr/lib/x86_64-linux-gnu/libclang-14.so.1."""
        return write_library(self.root / relative)

    def libclang(self) -> None:
        self.library("usr/lib/llvm-14/lib/libclang.so.1")

    def openmpi(self) -> None:
        self.tool("mpicc", OPENMPI_MPICC)
        self.tool("mpirun", OPENMPI_MPIRUN)

    def run(self, *arguments: str, check: bool = True, **environment: str) -> Result:
        """The script with `arguments` (with --check unless check=False) on this machine."""
        env = {
            "PATH": str(self.bin),
            "RINGLET_SYSROOT": str(self.root),
            "HOME": str(self.base),
            "BASH_ENV": str(self.guard),
            "RINGLET_TEST_EXTERNAL_LOG": str(self.external_log),
            **environment,
        }
        completed = subprocess.run(
            ["/bin/bash", str(SCRIPT), *(["--check"] if check else []), *arguments],
            cwd=self.base, env=env, capture_output=True, text=True, timeout=60,
        )
        external = self.external_log.read_text() if self.external_log.exists() else ""
        assert external == "", f"the script ran commands that are not builtins: {external.split()}"
        return Result(completed.returncode, completed.stdout, completed.stderr)


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def assert_found(result: Result) -> None:
    assert (result.code, result.missing) == (0, []), result


def assert_missing(result: Result, *packages: str) -> None:
    assert (result.code, result.missing) == (1, list(packages)), result
    assert result.stdout.count("\n") == 1, "--check prints the packages on one line"


def assert_broken(result: Result, *words: str) -> None:
    assert result.code == 2, result
    assert result.stdout == "", result
    for word in words:
        assert word in result.stderr, result


# --- libclang --------------------------------------------------------------------------------


def test_only_libclang_cpp_is_not_libclang(machine: Machine):
    machine.openmpi()
    machine.library("usr/lib/llvm-14/lib/libclang-cpp.so.14")
    machine.library("usr/lib/x86_64-linux-gnu/libclang-cpp.so.14")
    assert_missing(machine.run(), "libclang-dev")


@pytest.mark.parametrize("relative", [
    "usr/lib/x86_64-linux-gnu/libclang-14.so.14",    # versioned, Debian's multiarch directory
    "usr/lib/llvm-14/lib/libclang.so.1",             # suffix-versioned, LLVM's own directory
    "usr/lib/llvm-14/lib/libclang-14.so",
    "usr/lib/libclang.so",
    "usr/lib64/libclang.so.13",
    "usr/local/lib/libclang.so",
    "usr/local/lib64/llvm/libclang.so",
    "usr/local/lib/llvm-17/lib/libclang-17.so.17",
    "usr/local/llvm17/lib64/libclang.so",            # matches only /usr/local/llvm*/lib*
])
def test_libclang_found_in_each_system_directory(machine: Machine, relative: str):
    machine.openmpi()
    machine.library(relative)
    assert_found(machine.run())


@pytest.mark.parametrize("relative", [
    "usr/lib/llvm-14/lib/libclang-cpp.so",
    "usr/lib/llvm-14/lib/libclangBasic.a",
    "usr/lib/llvm-14/lib/libclang.a",
    "usr/lib/llvm-14/lib/libclang_rt.asan.so",
    "usr/lib/a/b/c/libclang.so",                     # deeper than clang-sys searches
    "opt/llvm/lib/libclang.so",                      # not a system directory
    "usr/share/libclang.so.1/placeholder",           # a directory named like the library
])
def test_what_is_not_libclang(machine: Machine, relative: str):
    machine.openmpi()
    machine.library(relative)
    assert_missing(machine.run(), "libclang-dev")


def test_nothing_at_all(machine: Machine):
    assert_missing(machine.run(), "libclang-dev", "libopenmpi-dev", "openmpi-bin")


def test_libclang_path_directory_with_libclang(machine: Machine, tmp_path: Path):
    machine.openmpi()
    write_library(tmp_path / "llvm" / "libclang-18.so.18.1")
    assert_found(machine.run(LIBCLANG_PATH=str(tmp_path / "llvm")))


def test_libclang_path_with_only_libclang_cpp_is_broken(machine: Machine, tmp_path: Path):
    machine.openmpi()
    machine.libclang()  # bindgen looks nowhere else when LIBCLANG_PATH is set
    write_library(tmp_path / "llvm" / "libclang-cpp.so.14")
    result = machine.run(LIBCLANG_PATH=str(tmp_path / "llvm"))
    assert_broken(result, "LIBCLANG_PATH", str(tmp_path / "llvm"))


def test_libclang_path_to_a_missing_directory_is_broken(machine: Machine, tmp_path: Path):
    machine.openmpi()
    machine.libclang()
    assert_broken(machine.run(LIBCLANG_PATH=str(tmp_path / "nowhere")), "LIBCLANG_PATH")


def test_libclang_path_to_the_library_file(machine: Machine, tmp_path: Path):
    machine.openmpi()
    library = write_library(tmp_path / "llvm" / "libclang.so.1")
    assert_found(machine.run(LIBCLANG_PATH=str(library)))


def test_libclang_path_to_another_file_is_broken(machine: Machine, tmp_path: Path):
    machine.openmpi()
    machine.libclang()
    library = write_library(tmp_path / "llvm" / "libclang-cpp.so.14")
    assert_broken(machine.run(LIBCLANG_PATH=str(library)), "LIBCLANG_PATH")


@pytest.mark.parametrize("subdirectory", ["lib", "lib64", "bin"])
def test_llvm_config_prefix(machine: Machine, tmp_path: Path, subdirectory: str):
    machine.openmpi()
    write_library(tmp_path / "llvm-18" / subdirectory / "libclang.so")
    machine.tool("llvm-config", {"--prefix": (0, f"{tmp_path / 'llvm-18'}\nsecond line")})
    assert_found(machine.run())


def test_llvm_config_that_fails_is_ignored(machine: Machine, tmp_path: Path):
    machine.openmpi()
    write_library(tmp_path / "llvm-18" / "lib" / "libclang.so")
    machine.tool("llvm-config", {"--prefix": (1, str(tmp_path / "llvm-18"))})
    assert_missing(machine.run(), "libclang-dev")


def test_llvm_config_path(machine: Machine, tmp_path: Path):
    machine.openmpi()
    write_library(tmp_path / "llvm-18" / "lib" / "libclang-18.so")
    tool = write_tool(tmp_path / "elsewhere" / "llvm-config-18",
                      {"--prefix": (0, str(tmp_path / "llvm-18"))})
    assert_found(machine.run(LLVM_CONFIG_PATH=str(tool)))


@pytest.mark.parametrize("variable", ["LD_LIBRARY_PATH", "LIBRARY_PATH"])
def test_library_path_variables(machine: Machine, tmp_path: Path, variable: str):
    machine.openmpi()
    write_library(tmp_path / "with space" / "libclang.so.1")
    write_library(tmp_path / "cpp" / "libclang-cpp.so.14")
    value = f"{tmp_path / 'nowhere'}::{tmp_path / 'cpp'}:{tmp_path / '*'}:{tmp_path / 'with space'}"
    assert_found(machine.run(**{variable: value}))
    assert_missing(machine.run(**{variable: f"{tmp_path / 'cpp'}:{tmp_path / '*'}"}),
                   "libclang-dev")


# --- MPI -------------------------------------------------------------------------------------


def test_no_mpi(machine: Machine):
    machine.libclang()
    assert_missing(machine.run(), "libopenmpi-dev", "openmpi-bin")


def test_open_mpi_complete(machine: Machine):
    machine.libclang()
    machine.openmpi()
    result = machine.run()
    assert_found(result)
    assert result.stderr == ""


def test_open_mpi_mpicc_without_a_launcher(machine: Machine):
    machine.libclang()
    machine.tool("mpicc", OPENMPI_MPICC)
    assert_missing(machine.run(), "openmpi-bin")


def test_open_mpi_launcher_without_mpicc(machine: Machine):
    machine.libclang()
    machine.tool("mpirun", OPENMPI_MPIRUN)
    assert_missing(machine.run(), "libopenmpi-dev")


def test_mpich_mpicc_without_a_launcher(machine: Machine):
    machine.libclang()
    machine.tool("mpicc", MPICH_MPICC)
    assert_missing(machine.run(), "mpich")


def test_mpich_mpiexec_only(machine: Machine):
    machine.libclang()
    machine.tool("mpiexec", MPICH_MPIRUN)
    assert_missing(machine.run(), "libmpich-dev")


def test_mpich_complete_through_mpiexec(machine: Machine):
    machine.libclang()
    machine.tool("mpicc", MPICH_MPICC)
    machine.tool("mpiexec", MPICH_MPIRUN)
    assert_found(machine.run())


def test_wrapper_of_unknown_origin_without_a_launcher_is_broken(machine: Machine):
    machine.libclang()
    machine.tool("mpicc", UNKNOWN_WRAPPER)
    assert_broken(machine.run(), "mpirun")


def test_mpicc_and_launcher_of_different_mpis_warn(machine: Machine):
    machine.libclang()
    machine.tool("mpicc", MPICH_MPICC)
    machine.tool("mpirun", OPENMPI_MPIRUN)
    result = machine.run()
    assert_found(result)
    assert "mpich" in result.stderr and "openmpi" in result.stderr


def test_mpicc_pointing_to_a_missing_file_is_broken(machine: Machine, tmp_path: Path):
    machine.libclang()
    machine.openmpi()  # a working mpicc on PATH does not make a wrong MPICC right
    assert_broken(machine.run(MPICC=str(tmp_path / "no" / "mpicc")), "MPICC")


def test_mpicc_naming_a_command_on_path(machine: Machine):
    machine.libclang()
    machine.tool("mpicc.mpich", MPICH_MPICC)  # no plain mpicc
    machine.tool("mpirun", MPICH_MPIRUN)
    assert_found(machine.run(MPICC="mpicc.mpich"))
    assert_missing(machine.run(), "libmpich-dev")


def test_mpicc_as_a_path(machine: Machine, tmp_path: Path):
    machine.libclang()
    machine.tool("mpirun", OPENMPI_MPIRUN)
    wrapper = write_tool(tmp_path / "openmpi" / "bin" / "mpicc", OPENMPI_MPICC)
    assert_found(machine.run(MPICC=str(wrapper)))


def test_mpi_pkg_config_needs_no_mpicc(machine: Machine, tmp_path: Path):
    machine.libclang()
    machine.tool("mpirun", MPICH_MPIRUN)
    pc = tmp_path / "mpich.pc"
    pc.write_text("Name: mpich\n")
    assert_found(machine.run(MPI_PKG_CONFIG=str(pc)))
    assert_found(machine.run(MPI_PKG_CONFIG="mpich"))
    assert_broken(machine.run(MPI_PKG_CONFIG=str(tmp_path / "missing.pc")), "MPI_PKG_CONFIG")


@pytest.mark.parametrize(("tools", "missing"), [
    ((), ["libmpich-dev", "mpich"]),
    (("mpicc.mpich",), ["mpich"]),
    (("mpirun.mpich",), ["libmpich-dev"]),
    (("mpicc.mpich", "mpirun.mpich"), []),
])
def test_mpich_beside_open_mpi(machine: Machine, tools: tuple[str, ...], missing: list[str]):
    machine.libclang()
    machine.openmpi()
    for name in tools:
        machine.tool(name, MPICH_MPICC if name.startswith("mpicc") else MPICH_MPIRUN)
    result = machine.run("--mpich")
    if missing:
        assert_missing(result, *missing)
    else:
        assert_found(result)
    assert_found(machine.run())  # MPICH is only asked for with --mpich


def test_without_check_and_without_apt_it_names_the_packages(machine: Machine):
    # We may be root, but apt-get is not on this PATH: the script says what to install.
    result = machine.run()
    assert_missing(result, "libclang-dev", "libopenmpi-dev", "openmpi-bin")
    install = machine.run("--mpich", check=False)
    assert install.code == 1 and install.stdout == ""
    assert "apt-get install libclang-dev libopenmpi-dev openmpi-bin libmpich-dev mpich" \
        in install.stderr


def test_nothing_missing_without_check_installs_nothing(machine: Machine):
    machine.libclang()
    machine.openmpi()
    result = machine.run(check=False)
    assert (result.code, result.stdout, result.stderr) == (0, "", "")


def test_unknown_argument(machine: Machine):
    result = machine.run("--frobnicate", check=False)
    assert result.code == 2 and "usage" in result.stderr


# --- the fakes against the real tools --------------------------------------------------------

REAL_TOOLS = [
    ("mpicc.openmpi", OPENMPI_MPICC, ["-showme:version", "-show"]),
    ("mpirun.openmpi", OPENMPI_MPIRUN, ["--version"]),
    ("mpicc.mpich", MPICH_MPICC, ["-v", "-show", "-showme:version"]),
    ("mpirun.mpich", MPICH_MPIRUN, ["--version", "-showme:version"]),
]


def normalized(output: str, name: str) -> str:
    """Output with the tool's Debian suffix, the host name and the typographic quotes removed."""
    output = output.replace(name, name.split(".")[0]).replace("(OpenRTE)", "(Open MPI)")
    output = re.sub(r"@[^]]*\]", "@host]", output)
    return output.replace("\u2018", "'").replace("\u2019", "'")


@pytest.mark.parametrize(("name", "responses", "arguments"), REAL_TOOLS,
                         ids=[tool[0] for tool in REAL_TOOLS])
def test_fakes_match_the_real_tools(name: str, responses: dict[str, tuple[int, str]],
                                    arguments: list[str]):
    """Where the real tool is installed, it answers as its fake does: same exit code, and the
    fake's first line within the real output (the libraries, for -show)."""
    real = shutil.which(name)
    if real is None:
        pytest.skip(f"{name} is not installed")
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    for argument in arguments:
        completed = subprocess.run([real, argument], capture_output=True, text=True, env=env,
                                   timeout=60)
        output = normalized(completed.stdout + completed.stderr, name)
        code, expected = responses[argument]
        assert completed.returncode == code, (argument, output)
        if argument == "-show":
            assert output.split()[-1] == expected.split()[-1], (argument, output)
        else:
            assert normalized(expected, name).splitlines()[0] in output, (argument, output)


# --- installing: MPICH beside the default MPI ------------------------------------------------

FAKE_APT_GET = """#!/bin/sh
printf '%s\\n' "apt-get $*" >>"$FAKE_LOG"
while [ "$1" = -o ]; do shift 2; done
[ "$1" = install ] || exit 0
# The packages bring mpicc.mpich and mpirun.mpich; a package may also switch the alternatives
# to itself (FAKE_APT_SWITCHES=1), which the script must undo.
for tool in mpicc.mpich mpirun.mpich; do
    printf '#!/bin/sh\\necho "MPICH version 4.0.2"\\n' >"$FAKE_BIN/$tool"
    chmod +x "$FAKE_BIN/$tool"
done
if [ "${FAKE_APT_SWITCHES:-0}" = 1 ]; then
    printf '%s\\n' /usr/bin/mpicc.mpich >"$FAKE_STATE/mpi"
    printf '%s\\n' /usr/bin/mpirun.mpich >"$FAKE_STATE/mpirun"
fi
"""
FAKE_UPDATE_ALTERNATIVES = """#!/bin/sh
case "$1" in
    --query) read -r value <"$FAKE_STATE/$2"; printf 'Name: %s\\nValue: %s\\n' "$2" "$value" ;;
    --set) printf '%s\\n' "$3" >"$FAKE_STATE/$2"
        printf '%s\\n' "update-alternatives --set $2 $3" >>"$FAKE_LOG" ;;
    *) exit 2 ;;
esac
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the script installs only as root")
@pytest.mark.parametrize("switches", [False, True])
def test_installing_mpich_keeps_the_default_mpi(machine: Machine, tmp_path: Path,
                                                switches: bool):
    """With apt-get and update-alternatives faked: MPICH is installed, and Debian's `mpi` and
    `mpirun` alternatives point where they pointed before, even if a package switched them."""
    machine.libclang()
    machine.openmpi()
    state = tmp_path / "alternatives"
    state.mkdir()
    (state / "mpi").write_text("/usr/bin/mpicc.openmpi\n")
    (state / "mpirun").write_text("/usr/bin/mpirun.openmpi\n")
    log = tmp_path / "commands.log"
    fakes = {"apt-get": FAKE_APT_GET, "update-alternatives": FAKE_UPDATE_ALTERNATIVES}
    for name, text in fakes.items():
        (machine.bin / name).write_text(text)
        (machine.bin / name).chmod(0o755)
    for name in ("sed", "chmod"):  # the install step (not the detection) may use these
        (machine.bin / name).symlink_to(shutil.which(name) or f"/bin/{name}")
    result = machine.run("--mpich", check=False, FAKE_LOG=str(log), FAKE_STATE=str(state),
                         FAKE_BIN=str(machine.bin), FAKE_APT_SWITCHES=str(int(switches)))
    assert result.code == 0, result
    assert "Installing libmpich-dev mpich with apt-get" in result.stdout
    commands = log.read_text().splitlines()
    lock = "apt-get -o DPkg::Lock::Timeout=600"
    assert commands[:2] == [f"{lock} update -qq", f"{lock} install -y -qq libmpich-dev mpich"]
    restored = ["update-alternatives --set mpi /usr/bin/mpicc.openmpi",
                "update-alternatives --set mpirun /usr/bin/mpirun.openmpi"]
    assert commands[2:] == (restored if switches else [])
    assert (state / "mpi").read_text() == "/usr/bin/mpicc.openmpi\n"
    assert (state / "mpirun").read_text() == "/usr/bin/mpirun.openmpi\n"
    assert_found(machine.run("--mpich"))


# --- apt-get while another holds its lock ----------------------------------------------------


def run_apt_get(tmp_path: Path, fails_first: str, *arguments: str) -> tuple[Result, list[str]]:
    """The script's apt_get function with a fake apt-get that fails once, printing
    `fails_first`, then succeeds: its result, and the arguments of each call of the fake."""
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "apt-get"
    fake.parent.mkdir()
    fake.write_text(f"""#!/bin/sh
printf '%s\\n' "$*" >>{shell_quote(str(calls))}
[ "$(wc -l <{shell_quote(str(calls))})" -gt 1 ] && exit 0
printf '%s\\n' {shell_quote(fails_first)} >&2
exit 100
""")
    fake.chmod(0o755)
    function = re.search(r"^apt_get\(\) \{\n.*?^\}\n", SCRIPT.read_text(), re.DOTALL | re.MULTILINE)
    assert function, "install_system_deps.sh has no apt_get function"
    program = f"set -euo pipefail\n{function.group(0)}apt_get {' '.join(arguments)}\n"
    completed = subprocess.run(
        ["/bin/bash", "-c", program], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"},
    )
    said = Result(completed.returncode, completed.stdout, completed.stderr)
    return said, calls.read_text().splitlines()


def test_apt_get_waits_while_another_apt_get_holds_the_package_lists_lock(tmp_path: Path):
    """Two checkouts' set-ups at once: `apt-get update` fails at once on the lists' lock
    (DPkg::Lock::Timeout waits for dpkg's lock only), so the script retries."""
    said, calls = run_apt_get(
        tmp_path,
        "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 9 (apt-get)",
        "update", "-qq")
    assert said.code == 0, said
    assert calls == ["-o DPkg::Lock::Timeout=600 update -qq"] * 2, calls
    assert "holds its lock; waiting" in said.stdout, said


def test_apt_get_reports_any_other_failure_at_once(tmp_path: Path):
    said, calls = run_apt_get(tmp_path, "E: Unable to locate package no-such-package",
                              "install", "-y", "no-such-package")
    assert said.code == 1, said
    assert calls == ["-o DPkg::Lock::Timeout=600 install -y no-such-package"], calls
    assert "Unable to locate package no-such-package" in said.stderr, said
