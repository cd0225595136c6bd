"""Other Slurm versions for the tests: Debian's own Slurm packages in debootstrapped roots.

The host runs its Debian's Slurm (22.05 on Debian 12, 24.11 on Debian 13). The matrix adds the
Slurm of the other Debian suites, each installed from Debian's packages into a
``debootstrap --variant=minbase`` root (no containers), see docs/slurm-versions.md:

================  =========  =============================
Debian suite      Slurm      data_parser (``--json``)
================  =========  =============================
bookworm (12)     22.05.8    v0.0.38
trixie (13)       24.11.5    v0.0.42
forky (next)      26.05.5    v0.0.45
================  =========  =============================

A root is built once into :data:`CACHE` (``/var/cache/slurm-spot/roots/<suite>``, kept between
CI runs where the machine keeps ``/var/cache``) from the Debian mirror that the host's own apt
configuration names (:func:`debian_mirror`). Commands run in a root by ``chroot`` with ``/proc``,
``/sys``, ``/dev``, ``/tmp``, the host's Python installation and the checkout bind-mounted at the
same paths, so the checkout's venv runs inside unchanged. :func:`mounted` undoes every mount
(``umount -R``) however the body ends.

Usable as a script: ``python -m tests.slurmroots build trixie``, ``... run trixie -- CMD``,
``... version trixie``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("SLURM_SPOT_ROOTS", "/var/cache/slurm-spot/roots"))
REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("slurm-wlm", "munge", "python3", "procps", "iproute2", "util-linux",
            "ca-certificates")
BUILD_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Suite:
    """A Debian suite whose Slurm the matrix tests: ``short`` is the Slurm series (``24.11``)."""

    name: str
    short: str
    script: str | None = None  # debootstrap script when the suite has none of its own


SUITES = {s.short: s for s in (Suite("bookworm", "22.05"), Suite("trixie", "24.11"),
                                Suite("forky", "26.05", "sid"))}
"""The matrix's versions, keyed by Slurm series (``make test-slurm VERSION=24.11``); the one the
host itself runs is tested directly, not in a root."""
MOUNT_NS_ENV = "SLURM_SPOT_ROOT_MOUNT_NS"
"""Set for ``run`` started by :func:`isolated_argv`: it is in a mount namespace of its own."""
INSIDE_ENV = "SLURM_SPOT_SLURM_ROOT"
"""Set (to the suite's name) for everything run inside a root."""
INNER_TIMEOUT_S = 3000


def suite_for(version_or_suite: str) -> Suite:
    """The suite for ``24.11``/``26.05`` or ``trixie``/``forky``.

    Raises:
        KeyError: neither a known Slurm series nor a suite name.
    """
    for suite in SUITES.values():
        if version_or_suite in (suite.name, suite.short):
            return suite
    raise KeyError(f"no Debian root for {version_or_suite!r}; known: "
                   + ", ".join(f"{s.short} ({s.name})" for s in SUITES.values()))


def debian_mirror(apt: Path = Path("/etc/apt")) -> str:
    """The Debian archive URL of the host's apt configuration (deb822 ``sources.list.d/*.sources``
    first, then one-line ``sources.list``/``*.list``), skipping the security archive and
    disabled stanzas.

    Raises:
        RuntimeError: apt names no Debian mirror.
    """
    for path in sorted((apt / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            enabled = re.search(r"^Enabled:\s*no\b", stanza, re.M | re.I) is None
            if uris and suites and enabled and "security" not in uris.group(1) \
                    and "security" not in suites.group(1):
                return uris.group(1)
    for path in [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*.list"))]:
        if path.exists():
            for line in path.read_text().splitlines():
                words = line.split()
                if len(words) >= 3 and words[0] == "deb" and "security" not in line:
                    url = next((w for w in words[1:] if "://" in w), None)
                    if url:
                        return url
    raise RuntimeError(f"no Debian mirror in {apt}/sources.list{{,.d}}; cannot build a Slurm root")


def root_path(suite: Suite) -> Path:
    return CACHE / suite.name


def is_built(suite: Suite) -> bool:
    return (root_path(suite) / ".slurm-spot-root").exists()


def build(suite: Suite, log: Path | None = None) -> Path:
    """Build the root of ``suite`` unless a complete one is cached; returns its path.

    A half-built root (a crashed earlier run) is removed first; the root becomes visible under
    :data:`CACHE` only when debootstrap finished (``.slurm-spot-root`` marker).

    Raises:
        RuntimeError: debootstrap failed (its log's tail is in the message).
    """
    target = root_path(suite)
    if is_built(suite):
        return target
    # One builder per suite: a second caller (the matrix test while the session's background
    # prebuild, see tests/conftest.py, is still at work) waits here, then finds the root built.
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{suite.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built(suite):
            return target
        return _build_locked(suite, target, log)


def _build_locked(suite: Suite, target: Path, log: Path | None) -> Path:
    _ensure_debootstrap()
    work = target.with_name(f".{suite.name}.partial")
    if work.exists():
        _umount_all(work)
        shutil.rmtree(work)
    work.parent.mkdir(parents=True, exist_ok=True)
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
            suite.name, str(work), debian_mirror()]
    if suite.script:
        argv.append(f"/usr/share/debootstrap/scripts/{suite.script}")
    started = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                              check=False, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    finally:
        _umount_all(work)  # debootstrap mounts /proc and /sys in the target
    if log is not None:
        log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"debootstrap {suite.name} failed ({proc.returncode}):\n"
                           + (proc.stdout + proc.stderr)[-3000:])
    # slurmctld is started by root; the test cluster needs a host name that resolves.
    (work / "var/cache/apt/archives").mkdir(parents=True, exist_ok=True)
    for deb in (work / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    (work / ".slurm-spot-root").write_text(
        f"built {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} in "
        f"{time.monotonic() - started:.0f} s\n")
    if target.exists():
        shutil.rmtree(target)
    work.rename(target)
    return target


def _ensure_debootstrap() -> None:
    if shutil.which("debootstrap"):
        return
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "debootstrap"]):
        subprocess.run(argv, check=True, timeout=600, capture_output=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def _binds() -> list[Path]:
    """Host folders that appear at the same place inside a root: scratch, the checkout, the
    venv, and the Python installation when it is one folder of its own (pyenv's; the
    distribution's own Python is bound by :func:`_system_python_binds` instead)."""
    paths = [Path("/tmp"), REPO]
    base = Path(sys.base_prefix)
    if base not in SYSTEM_PREFIXES:
        paths.insert(1, base)
    venv = Path(sys.prefix)
    if not venv.is_relative_to(REPO) and venv != base:
        paths.append(venv)
    return paths


SYSTEM_PREFIXES = (Path("/usr"), Path("/usr/local"))


def _system_python_binds(root: Path) -> list[tuple[Path, Path]]:
    """``(host path, mount point in root)`` for a venv made from the distribution's Python
    (``sys.base_prefix`` ``/usr``, as on a Debian machine without pyenv): binding the host's
    ``/usr`` over the root's would run the host's Slurm in every root. Bound instead: the
    standard library (``/usr/lib/python3.X``) and the interpreter, over the root's own
    ``python3.X`` and over what ``python3`` names inside the root (the venv's ``python``
    links to ``/usr/bin/python3``), all in the run's private mount namespace, so the root's
    own Python is hidden from that run only. The interpreter's shared libraries (libc, libz,
    libexpat, libssl, libffi) come from the root: a newer Debian keeps their sonames."""
    base = Path(sys.base_prefix)
    if base not in SYSTEM_PREFIXES:
        return []
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    interpreter = Path(os.path.realpath(base / "bin" / version))
    binds = [(base / "lib" / version, root / str(base / "lib" / version).lstrip("/")),
             (interpreter, root / str(base / "bin" / version).lstrip("/"))]
    venv_link = Path(sys.prefix) / "bin" / "python3"
    if venv_link.is_symlink():
        named = Path(os.readlink(venv_link))
        if named.is_absolute() and named != base / "bin" / version:
            binds.append((interpreter, _resolve_inside(root, named)))
    return binds


def _resolve_inside(root: Path, path: Path) -> Path:
    """``path`` as the root sees it, its symlinks followed inside ``root`` (an absolute link
    target is taken relative to ``root``, never to the host's ``/``)."""
    current = root / str(path).lstrip("/")
    for _ in range(16):
        if not current.is_symlink():
            return current
        target = Path(os.readlink(current))
        current = (root / str(target).lstrip("/") if target.is_absolute()
                   else current.parent / target)
    raise RuntimeError(f"{path}: too many symlinks inside {root}")


def _mountpoints(root: Path) -> list[str]:
    """Mount points at or under ``root`` (from /proc/self/mountinfo), deepest first."""
    prefix = str(root.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(found, key=len, reverse=True)


def _umount_all(root: Path) -> None:
    """``umount -R`` everything under ``root``; lazily when a mount is still busy."""
    for point in _mountpoints(root):
        if subprocess.run(["umount", "-R", point], capture_output=True, timeout=60,
                          check=False).returncode != 0:
            subprocess.run(["umount", "-R", "-l", point], capture_output=True, timeout=60,
                           check=False)


@contextlib.contextmanager
def mounted(suite: Suite) -> Iterator[Path]:
    """The built root of ``suite`` with its bind mounts in place; all undone on exit. Only in
    the private mount namespace of :func:`isolated_argv` (``run``).

    Raises:
        RuntimeError: the root is not built (run :func:`build`), or this process is on the
            host's mount namespace.
    """
    root = root_path(suite)
    if not os.environ.get(MOUNT_NS_ENV):
        raise RuntimeError("the roots' mounts are made only in the private mount namespace of "
                           "a run (isolated_argv), never on the host's")
    if not is_built(suite):
        raise RuntimeError(f"{root} is not built; run: python -m tests.slurmroots build {suite.name}")
    _umount_all(root)  # a crashed earlier run
    try:
        _mount(["-t", "proc", "proc"], root / "proc")
        _mount(["--rbind", "/sys"], root / "sys")
        _mount(["--make-rslave"], root / "sys", bind=False)
        _mount(["--rbind", "/dev"], root / "dev")
        _mount(["--make-rslave"], root / "dev", bind=False)
        for path in _binds():
            _mount(["--bind", str(path)], root / str(path).lstrip("/"))
        for source, point in _system_python_binds(root):
            _mount_file_or_dir(source, point)
        _hosts(root)
        yield root
    finally:
        _umount_all(root)
        leftovers = _mountpoints(root)
        if leftovers:
            raise RuntimeError(f"could not unmount {leftovers}")


def _mount(args: list[str], point: Path, bind: bool = True) -> None:
    if bind:
        point.mkdir(parents=True, exist_ok=True)
        argv = ["mount", *args, str(point)]
    else:
        argv = ["mount", *args, str(point)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")


def _mount_file_or_dir(source: Path, point: Path) -> None:
    """Bind ``source`` (a file or a folder) at ``point``, creating an empty one there first."""
    if source.is_dir():
        point.mkdir(parents=True, exist_ok=True)
    elif not point.exists():
        point.parent.mkdir(parents=True, exist_ok=True)
        point.touch()
    _mount(["--bind", str(source)], point, bind=False)


def _hosts(root: Path) -> None:
    """The host's name must resolve inside the root (slurmctld and munge look it up)."""
    hosts = root / "etc/hosts"
    name = os.uname().nodename
    text = hosts.read_text() if hosts.exists() else "127.0.0.1 localhost\n"
    if not re.search(rf"\s{re.escape(name)}(\s|$)", text):
        hosts.write_text(text.rstrip("\n") + f"\n127.0.1.1 {name}\n")


def chroot_argv(root: Path, argv: list[str], cwd: Path = REPO) -> list[str]:
    """argv that runs ``argv`` in ``root`` from ``cwd``, with the checkout's venv first on PATH."""
    path = f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return ["chroot", str(root), "/usr/bin/env", f"--chdir={cwd}", f"PATH={path}", *argv]


def host_series() -> str | None:
    """``22.05`` for the host's own Slurm (from ``slurmctld -V``), None without one."""
    try:
        out = subprocess.run(["/usr/sbin/slurmctld", "-V"], capture_output=True, text=True,
                             timeout=30, check=False).stdout
    except OSError:
        return None
    match = re.search(r"(\d+\.\d+)", out)
    return match.group(1) if match else None


def kill_processes_in(root: Path) -> list[int]:
    """SIGKILL every process whose root directory is ``root`` (all were started there by
    :func:`run_pytest`: munged, slurmctld, slurmd, hooks); returns their pids."""
    target = str(root.resolve())
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/root") == target:
                os.kill(int(entry), 9)
                killed.append(int(entry))
        except OSError:
            continue
    if killed:
        time.sleep(0.5)
    return killed


@dataclass(frozen=True)
class RunResult:
    """What a pytest run in a root gave: exit code, ``slurm 24.11.5``, stdout+stderr."""

    returncode: int
    version: str
    output: str


def isolated_argv(suite: Suite, command: list[str]) -> list[str]:
    """argv that runs ``command`` in the root of ``suite`` with its bind mounts made in a mount
    namespace of its own (``unshare --mount --propagation private``, util-linux): the mounts
    exist only for the processes of that run and vanish with the last of them, however the run
    ends. On the host's side the root's ``tmp``, ``dev`` and the Python and checkout folders stay
    plain directories, so nothing that walks the roots cache (``rm -rf``, ``shutil.rmtree``)
    can reach the host's files through a mount a killed run left behind."""
    return ["unshare", "--mount", "--propagation", "private", "--", "/usr/bin/env",
            f"{MOUNT_NS_ENV}=1", sys.executable, "-m", "tests.slurmroots", "run", suite.name,
            "--", *command]


def run_pytest(suite: Suite, args: list[str], timeout_s: float = INNER_TIMEOUT_S,
               stream: bool = False) -> RunResult:
    """Run ``python -m pytest ARGS`` of this checkout inside the root of ``suite`` (built), its
    mounts in a namespace of the run's own (:func:`isolated_argv`), then stop whatever it left
    running there. ``stream`` prints as it goes."""
    from tests.cluster import LOCK_HELD_ENV, acquire_cluster_lock

    root = root_path(suite)
    # One slurmctld on the network: hold the test-cluster lock around the whole run, so no
    # other test run's cluster comes in between (the run's own clusters then take nothing).
    with acquire_cluster_lock():
        version = slurm_version_in(root)
        argv = isolated_argv(suite, ["/usr/bin/env", f"{INSIDE_ENV}={suite.name}",
                                     f"{LOCK_HELD_ENV}={os.getpid()}",
                                     f"HOME={os.environ.get('HOME', '/root')}",
                                     sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                                     "-q", *args])
        try:
            if stream:
                proc = subprocess.run(argv, cwd=REPO, timeout=timeout_s, check=False)
                output = ""
            else:
                done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                                      timeout=timeout_s, check=False)
                proc, output = done, done.stdout + done.stderr
            code = proc.returncode
        except subprocess.TimeoutExpired as exc:
            code, output = 124, f"timed out after {timeout_s:g} s\n{exc.stdout or ''}"
        finally:
            kill_processes_in(root)
    return RunResult(code, version, output)


def start_prebuild(log: Path = Path("/tmp/slurm-spot-roots-prebuild.log")) -> subprocess.Popen[bytes] | None:
    """Start building, in the background and at low priority, every root the matrix will need
    that is not cached yet (all but the host's own series), one after the other.

    ``make test`` calls this when the session starts, so the few minutes of debootstrap overlap
    the unit tests instead of adding to the matrix test's time; the matrix's own :func:`build`
    then waits on the same per-suite lock and finds the root built. Returns the builder process
    (the caller stops it if the session ends first), or None when nothing needs building.
    """
    host = host_series()
    wanted = [s.short for s in SUITES.values() if s.short != host and not is_built(s)]
    if not wanted:
        return None
    with open(log, "ab") as out:
        return subprocess.Popen(["nice", "-n", "10", sys.executable, "-m", "tests.slurmroots",
                                 "build", *wanted], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # its own group: stop debootstrap too


def slurm_version_in(root: Path) -> str:
    """``slurmctld -V`` inside ``root``: ``"slurm 24.11.5"``."""
    out = subprocess.run(["chroot", str(root), "/usr/sbin/slurmctld", "-V"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return out.strip()


def main(argv: list[str]) -> int:
    """``build SUITE|all`` (prints seconds taken), ``version SUITE``, ``run SUITE -- CMD...``,
    ``test SUITE [PYTEST ARGS]`` (the end-to-end suite in that root)."""
    if not argv or argv[0] not in ("build", "version", "run", "test"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "build":
        names = [s.short for s in SUITES.values()] if argv[1:] in ([], ["all"]) else argv[1:]
        for name in names:
            suite = suite_for(name)
            cached = is_built(suite)
            started = time.monotonic()
            build(suite)
            print(f"{suite.name}: {'cached' if cached else 'built'} in "
                  f"{time.monotonic() - started:.0f} s at {root_path(suite)}", flush=True)
        return 0
    suite = suite_for(argv[1])
    if argv[0] == "version":
        print(slurm_version_in(build(suite)))
        return 0
    if argv[0] == "test":
        build(suite)
        args = argv[2:] or ["-m", "e2e", "--deselect", "tests/test_slurm_matrix.py"]
        print(f"running the end-to-end tests on {slurm_version_in(root_path(suite))} "
              f"({suite.name} root)", flush=True)
        return run_pytest(suite, args, stream=True).returncode
    command = argv[argv.index("--") + 1:] if "--" in argv else argv[2:]
    if not os.environ.get(MOUNT_NS_ENV):
        return subprocess.run(isolated_argv(suite, command), cwd=REPO, check=False,
                              timeout=3600).returncode
    with mounted(suite) as root:
        try:
            return subprocess.run(chroot_argv(root, command), check=False,
                                  timeout=3600).returncode
        finally:
            kill_processes_in(root)  # its daemons, before their mounts go


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
