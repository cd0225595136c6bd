"""Accounting for the local cluster: a private MariaDB server and slurmdbd, so ``sacct`` works
as on a real site (clients such as submitit poll it).

``local up`` initialises a data directory under ``<state_dir>/mysql`` once
(``mariadb-install-db``), starts ``mariadbd`` on a unix socket only (``--skip-networking``; no
system service, no TCP port), creates the ``slurm_acct_db`` database, writes ``slurmdbd.conf``
beside slurm.conf (slurmdbd reads it from the folder of ``$SLURM_CONF``; mode 0600, as
slurmdbd.conf(5) of Slurm 22.05 requires) and starts ``slurmdbd -D``, which reaches the server
through ``MYSQL_UNIX_PORT`` (honoured by the MariaDB client library). ``local down`` stops both
by the pids ``up`` recorded. Packages: ``mariadb-server`` and ``slurmdbd`` (Debian 12).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_spot.errors import SlurmSpotError
from slurm_spot.localcluster.daemons import Under, socket_answers
from slurm_spot.slurm.client import CommandResult, run_command

MARIADBD = Path("/usr/sbin/mariadbd")
INSTALL_DB = Path("/usr/bin/mariadb-install-db")
MARIADB = Path("/usr/bin/mariadb")
SLURMDBD = Path("/usr/sbin/slurmdbd")
DBD_PORT = 6819
DATABASE = "slurm_acct_db"


def available() -> bool:
    """True if MariaDB's server and Slurm's slurmdbd are installed."""
    return all(p.exists() for p in (MARIADBD, INSTALL_DB, MARIADB, SLURMDBD))


@dataclass(frozen=True)
class DbPaths:
    """The private database server's files under ``<state_dir>/mysql``."""

    root: Path
    data = Under("root", "data")
    socket = Under("root", "mysqld.sock")
    #: The server's own temporary directory (``--tmpdir``), not the shared /tmp: there
    #: another MariaDB (a Slurm root's, whose pids may be the same numbers in its own pid
    #: namespace) made and removed ``#sql-temptable-<pid>-...`` files of the same names,
    #: and ``mariadb-install-db`` failed ("Unknown table 'mysql.tmp_user_nopasswd'").
    tmp = Under("root", "tmp")
    pid_file = Under("root", "mysqld.pid")


def _run(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> CommandResult:
    """The one command runner; a timeout or a missing program is a SlurmSpotError."""
    return run_command(argv, timeout_s, env)


def _port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def start_database(state_dir: Path, log_dir: Path, fresh: bool = True,
                   timeout_s: float = 60) -> int:
    """Initialise (first time only) and start the private MariaDB server; create the
    accounting database, dropping an old one first when ``fresh`` (slurmctld started with
    ``-c`` numbers jobs from 1 again, so old records would share their ids). Returns the
    server's pid.

    Raises:
        SlurmSpotError: initialisation fails or the server does not answer in ``timeout_s``
            (the message names its error log).
    """
    db = DbPaths(state_dir / "mysql")
    db.root.mkdir(parents=True, exist_ok=True)
    db.tmp.mkdir(mode=0o700, exist_ok=True)
    err_log = log_dir / "mysqld.err"
    if not (db.data / "mysql").is_dir():
        done = _run([str(INSTALL_DB), "--no-defaults", f"--datadir={db.data}", "--user=root",
                     "--auth-root-authentication-method=socket", "--skip-test-db",
                     f"--tmpdir={db.tmp}"], 120)
        if done.returncode != 0:
            raise SlurmSpotError(f"mariadb-install-db failed: {done.stderr.strip()[-500:]}")
    db.socket.unlink(missing_ok=True)
    proc = subprocess.Popen(  # noqa: S603 - argv list
        [str(MARIADBD), "--no-defaults", f"--datadir={db.data}", f"--socket={db.socket}",
         "--skip-networking", f"--pid-file={db.pid_file}", f"--log-error={err_log}",
         f"--tmpdir={db.tmp}",
         "--user=root", "--skip-log-bin", "--innodb-lock-wait-timeout=900"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while not socket_answers(db.socket):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SlurmSpotError(f"the local MariaDB server did not start; see {err_log}")
        time.sleep(0.1)
    sql = f"CREATE DATABASE IF NOT EXISTS {DATABASE}"
    if fresh:
        sql = f"DROP DATABASE IF EXISTS {DATABASE}; {sql}"
    made = _run([str(MARIADB), "--no-defaults", f"--socket={db.socket}", "-u", "root", "-e", sql],
                30)
    if made.returncode != 0:
        proc.kill()
        raise SlurmSpotError(f"cannot create the accounting database: {made.stderr.strip()}")
    return proc.pid


def write_slurmdbd_conf(conf_dir: Path, state_dir: Path, log_dir: Path, port: int = DBD_PORT) -> Path:
    """``<conf_dir>/slurmdbd.conf`` for the private server (mode 0600). Returns its path."""
    path = conf_dir / "slurmdbd.conf"
    text = "\n".join([
        "# Managed by slurm-spot: accounting of the local spot cluster (slurm-spot local up).",
        "AuthType=auth/munge",
        "DbdHost=localhost",
        f"DbdPort={port}",
        "SlurmUser=root",
        f"LogFile={log_dir / 'slurmdbd.log'}",
        f"PidFile={state_dir / 'slurmdbd.pid'}",
        "StorageType=accounting_storage/mysql",
        "StorageHost=localhost",
        "StorageUser=root",
        f"StorageLoc={DATABASE}",
        "",
    ])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)
    return path


def start_slurmdbd(slurm_conf: Path, state_dir: Path, log_dir: Path, port: int = DBD_PORT,
                   timeout_s: float = 60) -> int:
    """Start ``slurmdbd -D`` against the private server; wait until it listens on ``port``.
    Returns its pid.

    Raises:
        SlurmSpotError: another process already listens on ``port``, or slurmdbd does not
            listen within ``timeout_s`` (the message names its log).
    """
    if _port_answers(port):
        raise SlurmSpotError(f"another slurmdbd (or program) already listens on port {port}")
    log = open(log_dir / "slurmdbd.out", "ab")
    env = {**os.environ, "SLURM_CONF": str(slurm_conf),
           "MYSQL_UNIX_PORT": str(DbPaths(state_dir / "mysql").socket)}
    proc = subprocess.Popen(  # noqa: S603 - argv list
        [str(SLURMDBD), "-D"], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
        start_new_session=True)
    log.close()
    deadline = time.monotonic() + timeout_s
    while not _port_answers(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SlurmSpotError(f"slurmdbd did not start; see {log_dir / 'slurmdbd.log'}")
        time.sleep(0.2)
    return proc.pid


def register_cluster(cluster: str, slurm_bin_dir: Path, env: dict[str, str]) -> None:
    """``sacctmgr -i add cluster NAME`` unless slurmdbd knows it (slurmctld only sends its
    jobs to a registered cluster).

    Raises:
        SlurmSpotError: sacctmgr fails."""
    shown = _run([str(slurm_bin_dir / "sacctmgr"), "-n", "-P", "list", "cluster",
                  "format=cluster"], 30, env)
    if cluster in shown.stdout.split():
        return
    added = _run([str(slurm_bin_dir / "sacctmgr"), "-i", "add", "cluster", cluster], 30, env)
    if added.returncode != 0:
        raise SlurmSpotError(f"sacctmgr add cluster {cluster}: {added.stderr.strip()}")
