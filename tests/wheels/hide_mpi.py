"""Run a command on this machine as if no MPI were installed: for real, not by mocking.

    unshare --mount --propagation private python3 hide_mpi.py --scratch DIR [--libdir DIR] \
        -- COMMAND...

Run as root in a private mount namespace (unshare does that; nothing here is seen outside it
and everything ends with the namespace). It mounts an overlay over the system's library
directory whose upper layer holds a whiteout (a 0/0 character device) for every MPI library
file (libmpi*, libmpich*, libopen-*, in subdirectories too), rebuilds the dynamic linker's
cache from what is left and binds it over /etc/ld.so.cache, checks that no MPI library is
left (by listing, by the cache, and by dlopen), then execs COMMAND.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

MPI_FILE = re.compile(r"^(libmpi|libopen-)")  # libmpi* covers libmpich*
SONAMES = ("libmpi.so.40", "libmpi.so.12", "libmpich.so.12", "libmpi.so", "libmpich.so")
LDCONFIG = "/sbin/ldconfig"


def mpi_files(libdir: Path) -> list[Path]:
    """Every MPI library file or link under `libdir`, relative to it."""
    found = []
    for directory, _, names in os.walk(libdir):
        found += [Path(directory, name).relative_to(libdir) for name in names
                  if MPI_FILE.match(name)]
    return sorted(found)


def run(command: list[str]) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def hide(libdir: Path, scratch: Path) -> list[Path]:
    """The overlay, the new linker cache; returns what was hidden."""
    hidden = mpi_files(libdir)
    if not hidden:
        sys.exit(f"hide_mpi: no MPI library under {libdir} to hide: nothing would be tested")
    # The layers on a tmpfs of this namespace: gone when it ends.
    run(["mount", "-t", "tmpfs", "tmpfs", str(scratch)])
    upper, work = scratch / "upper", scratch / "work"
    for relative in hidden:
        whiteout = upper / relative
        whiteout.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(whiteout, stat.S_IFCHR | 0o600, os.makedev(0, 0))
    work.mkdir()
    run(["mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={libdir},upperdir={upper},workdir={work}", str(libdir)])
    # The cache still names the hidden files; a machine without MPI has none in its cache.
    cache = scratch / "ld.so.cache"
    run([LDCONFIG, "-X", "-C", str(cache)])  # -X: write no links outside the overlay
    run(["mount", "--bind", str(cache), "/etc/ld.so.cache"])
    return hidden


def verify(libdir: Path, hidden: list[Path]) -> None:
    """No MPI library visible, in the cache, or loadable; else exit non-zero."""
    left = [str(libdir / p) for p in hidden if os.path.lexists(libdir / p)]
    left += [str(libdir / p) for p in mpi_files(libdir)]
    cached = [line.strip() for line in run([LDCONFIG, "-p"]).splitlines()
              if re.search(r"\blib(mpi|mpich|open-(pal|rte))\b", line)]
    loadable = []
    for soname in SONAMES:
        try:
            ctypes.CDLL(soname)
            loadable.append(soname)
        except OSError:
            pass
    if left or cached or loadable:
        sys.exit(f"hide_mpi: MPI still reachable: files {left}, cache {cached}, "
                 f"dlopen {loadable}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--libdir", default="/usr/lib/x86_64-linux-gnu")
    parser.add_argument("--scratch", type=Path, required=True,
                        help="an empty directory; a tmpfs is mounted on it in the namespace")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    if os.geteuid() != 0:
        sys.exit("hide_mpi: needs root (mounts in a private namespace, under unshare)")
    # Refuse to mount anything unless this is a mount namespace of its own (unshare execs this
    # script in place, so the parent is outside it): the overlay must never reach the machine's.
    if os.readlink("/proc/self/ns/mnt") == os.readlink(f"/proc/{os.getppid()}/ns/mnt"):
        sys.exit("hide_mpi: not in a private mount namespace (run it under unshare --mount)")
    libdir = Path(args.libdir)
    args.scratch.mkdir(parents=True, exist_ok=True)
    hidden = hide(libdir, args.scratch)
    verify(libdir, hidden)
    print(f"hide_mpi: {len(hidden)} MPI library files hidden under {libdir} "
          f"(e.g. {', '.join(str(p) for p in hidden[:4])}); none listed, cached or loadable",
          flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
