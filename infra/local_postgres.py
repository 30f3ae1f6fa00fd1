"""A real local PostgreSQL server started from Python, without Docker.

Role: give tests, benchmarks and local development a PostgreSQL cluster whose files all live
under ``home`` (data in ``home/pg-data``, socket and server log in ``home/pg-run``), listening
on 127.0.0.1 only, with a password-authenticated application role.

Guarantees:
- ``ensure_installed`` finds the server binaries (``pg_config --bindir``, then
  /usr/lib/postgresql/*/bin) and, when there are none, installs Debian's ``postgresql``
  package non-interactively (without starting Debian's own cluster), or says why it could
  not.
- Run as root, every server-side command runs as the ``postgres`` OS user (the server
  refuses to run as root); the data directory is owned by it. Run as another user, the
  server runs as that user.
- ``start`` runs initdb once, rewrites ``duetime.conf`` (port, addresses, socket dir) on
  every start, reuses a live server of the same data directory, recovers from a SIGKILLed
  server (stale ``postmaster.pid``, orphaned backends), refuses with the holder's pid a port
  that something else listens on, and never waits past its deadline.
- ``fast_unsafe=True`` turns off fsync, synchronous_commit and full_page_writes: much faster
  tests, but a machine crash can corrupt the cluster. Never use it for data you keep.
"""

from __future__ import annotations

import contextlib
import getpass
import glob
import logging
import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from .process import (
    InfraError,
    describe_pid,
    ensure_port_free,
    pid_alive,
    port_open,
    process_name,
    read_pid_file,
    tail,
    wait_until,
)

log = logging.getLogger("duetime.infra")

SERVER_OS_USER = "postgres"


def find_bindir() -> Path | None:
    """The directory with PostgreSQL's server binaries (initdb, pg_ctl, postgres), if any.

    ``pg_config`` may come from libpq-dev without the server, so initdb must be there too;
    among several installed versions the newest wins.
    """
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            if out and (Path(out) / "initdb").exists():
                return Path(out)

    def version(p: str) -> int:
        try:
            return int(Path(p).parent.parent.name)
        except ValueError:
            return 0

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    if candidates:
        return Path(candidates[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def _apt_install_postgresql() -> None:
    """``apt-get update && apt-get install -y postgresql`` without starting any service."""
    if os.geteuid() != 0:
        raise InfraError(
            "PostgreSQL server binaries not found and not root: install them "
            "(apt-get install -y postgresql) or put initdb on PATH"
        )
    if shutil.which("apt-get") is None:
        raise InfraError("PostgreSQL server binaries not found and there is no apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Debian's postinst would start its own cluster on port 5432; a policy-rc.d that answers
    # 101 ("action forbidden") keeps it stopped. Only ours is removed afterwards.
    policy = Path("/usr/sbin/policy-rc.d")
    added_policy = False
    if not policy.exists():
        policy.write_text("#!/bin/sh\n# duetime: no service starts during install\nexit 101\n")
        policy.chmod(0o755)
        added_policy = True
    try:
        for cmd in (
            ["apt-get", "update"],
            ["apt-get", "install", "-y", "--no-install-recommends", "postgresql"],
        ):
            log.info("running %s (PostgreSQL server binaries are missing)", " ".join(cmd))
            started = time.monotonic()
            res = subprocess.run(
                cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                timeout=900,
            )  # fmt: skip
            if res.returncode != 0:
                raise InfraError(
                    f"{' '.join(cmd)} failed (exit {res.returncode}):\n"
                    f"{res.stdout[-2000:]}{res.stderr[-2000:]}"
                )
            log.info("%s took %.1f s", " ".join(cmd), time.monotonic() - started)
    except subprocess.TimeoutExpired as exc:
        raise InfraError(f"{' '.join(map(str, exc.cmd))} did not finish in 900 s") from None
    finally:
        if added_policy:
            policy.unlink(missing_ok=True)


class LocalPostgres:
    """A PostgreSQL cluster in ``home/pg-data`` on 127.0.0.1:``port``."""

    def __init__(
        self,
        home: Path,
        port: int = 5432,
        user: str = "duetime",
        password: str = "duetime",
        fast_unsafe: bool = False,
    ) -> None:
        self.home = Path(home).resolve()
        self.port = port
        self.user = user
        self.password = password
        self.fast_unsafe = fast_unsafe
        self.data_dir = self.home / "pg-data"
        self.run_dir = self.home / "pg-run"
        self.log_file = self.run_dir / "postgres.log"
        self._bindir: Path | None = None
        as_root = os.geteuid() == 0
        self._os_user = SERVER_OS_USER if as_root else getpass.getuser()
        self._as_root = as_root

    # ------------------------------------------------------------------ public API

    def ensure_installed(self) -> Path:
        """Return the server bin dir, installing Debian's postgresql package when missing."""
        if self._bindir is not None:
            return self._bindir
        bindir = find_bindir()
        if bindir is None:
            _apt_install_postgresql()
            bindir = find_bindir()
            if bindir is None:
                raise InfraError(
                    "installed the postgresql package but found no initdb in "
                    "/usr/lib/postgresql/*/bin or on PATH"
                )
        self._bindir = bindir
        return bindir

    def url(self, dbname: str = "duetime") -> str:
        """A libpq URL for the application role."""
        from urllib.parse import quote

        return (
            f"postgresql://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
            f"@127.0.0.1:{self.port}/{quote(dbname, safe='')}"
        )

    def start(self, timeout_s: float = 60) -> float:
        """Start (or reuse) the server and make sure the role exists; return seconds taken."""
        started = time.monotonic()
        deadline = started + timeout_s
        bindir = self.ensure_installed()
        self._prepare_dirs()
        if not self._reuse_existing(deadline):
            stale = self._clear_leftovers(deadline)
            ensure_port_free(self.port, "PostgreSQL", grace_s=5.0 if stale else 0.0)
            if not (self.data_dir / "PG_VERSION").exists():
                self._initdb(bindir, deadline)
            self._write_conf()
            self._pg_ctl_start(bindir, deadline)
        self._ensure_role()
        wait_until(
            self._answers_select_1,
            max(1.0, deadline - time.monotonic()),
            f"PostgreSQL to answer 'select 1' as {self.user} on 127.0.0.1:{self.port}",
        )
        took = time.monotonic() - started
        log.info("PostgreSQL ready on 127.0.0.1:%d in %.1f s", self.port, took)
        return took

    def stop(self, timeout_s: float = 30) -> None:
        """``pg_ctl stop -m fast``; SIGQUIT then SIGKILL the postmaster if that fails."""
        pid = self.pid
        if pid is None:
            return
        bindir = self.ensure_installed()
        log.info("stopping PostgreSQL (pid %d)", pid)
        try:
            res = self._run_as_server(
                [str(bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w",
                 "-t", str(max(1, int(timeout_s))), "stop"],
                timeout=timeout_s + 5,
            )  # fmt: skip
            ok = res.returncode == 0
            if not ok:
                log.warning("pg_ctl stop failed: %s", (res.stdout + res.stderr).strip())
        except subprocess.TimeoutExpired:
            ok = False
        if ok and not pid_alive(pid):
            return
        for sig in (signal.SIGQUIT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            with contextlib.suppress(TimeoutError):
                wait_until(lambda: not pid_alive(pid), 5, f"postmaster {pid} to exit")
                return
        raise InfraError(f"PostgreSQL postmaster (pid {pid}) survived SIGKILL")

    def is_running(self) -> bool:
        """True when this data directory's postmaster is alive and accepts connections."""
        return self.pid is not None and port_open(self.port)

    @property
    def pid(self) -> int | None:
        """The postmaster's pid from ``postmaster.pid``, when it is a live postgres process."""
        pid = read_pid_file(self.data_dir / "postmaster.pid")
        if pid is None or not pid_alive(pid) or process_name(pid) != "postgres":
            return None
        return pid

    def create_database(self, name: str) -> None:
        """Create database ``name`` owned by the application role, unless it exists."""
        sql = (
            "SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'owner') "
            "WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') \\gexec\n"
        )
        self._psql(sql, {"db": name, "owner": self.user}, ok_if="already exists")

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` if it exists, ending its connections."""
        sql = "SELECT format('DROP DATABASE IF EXISTS %I WITH (FORCE)', :'db') \\gexec\n"
        self._psql(sql, {"db": name})

    # ------------------------------------------------------------------ internals

    def _run_as_server(
        self, cmd: list[str], timeout: float, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` as the server's OS user (dropping root when we are root)."""
        kwargs: dict[str, Any] = {}
        env = {
            **os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "HOME": str(self.run_dir),
        }  # fmt: skip
        env.pop("PGDATA", None)
        if self._as_root:
            kwargs = {"user": self._os_user, "group": self._server_gid(), "extra_groups": []}
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            input=input_text,
            stdin=None if input_text is not None else subprocess.DEVNULL,
            cwd=str(self.run_dir),
            env=env,
            timeout=max(1.0, timeout),
            **kwargs,
        )

    def _server_gid(self) -> int:
        return pwd.getpwnam(self._os_user).pw_gid

    def _ensure_os_user(self) -> None:
        try:
            pwd.getpwnam(self._os_user)
        except KeyError:
            if not self._as_root:
                raise
            log.info("creating the %s OS user", self._os_user)
            subprocess.run(
                ["useradd", "--system", "--user-group", "--no-create-home",
                 "--shell", "/usr/sbin/nologin", self._os_user],
                check=True, capture_output=True, timeout=30,
            )  # fmt: skip

    def _prepare_dirs(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self._ensure_os_user()
        for d in (self.data_dir, self.run_dir):
            d.mkdir(exist_ok=True)
        self.data_dir.chmod(0o700)
        if not self._as_root:
            return
        pw = pwd.getpwnam(self._os_user)
        for d in (self.data_dir, self.run_dir):
            if d.stat().st_uid != pw.pw_uid:
                os.chown(d, pw.pw_uid, pw.pw_gid)
        # The server user must be able to reach home: find the first directory it cannot enter.
        res = self._run_as_server(["test", "-x", str(self.data_dir)], timeout=10)
        if res.returncode != 0:
            blocked = next(
                (p for p in [*reversed(self.data_dir.parents)] if not (p.stat().st_mode & 0o001)),
                self.home,
            )
            raise InfraError(
                f"the {self._os_user} OS user cannot reach {self.data_dir}: {blocked} is not "
                f"searchable by others (chmod o+x {blocked}, or choose a home under a "
                "world-searchable directory)"
            )

    def _reuse_existing(self, deadline: float) -> bool:
        """True when this data directory's server is already running and answering."""
        pid = self.pid
        if pid is None:
            return False
        if not self._postmaster_of_our_data_dir(pid):
            return False
        lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        running_port = int(lines[3]) if len(lines) > 3 and lines[3].strip().isdigit() else None
        if running_port != self.port:
            raise InfraError(
                f"PostgreSQL of {self.data_dir} is already running (pid {pid}) on port "
                f"{running_port}, not {self.port}: stop it first"
            )
        log.info("reusing running PostgreSQL pid %d on 127.0.0.1:%d", pid, self.port)
        wait_until(
            lambda: port_open(self.port),
            max(1.0, deadline - time.monotonic()),
            f"the running PostgreSQL (pid {pid}) to accept connections on port {self.port}",
            abort=lambda: None if pid_alive(pid) else f"pid {pid} exited",
        )
        return True

    def _postmaster_of_our_data_dir(self, pid: int) -> bool:
        with contextlib.suppress(OSError):
            return Path(f"/proc/{pid}/cwd").resolve() == self.data_dir
        # No permission to read another user's cwd: trust postmaster.pid's data dir line.
        lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        return len(lines) > 1 and Path(lines[1]).resolve() == self.data_dir

    def _initdb(self, bindir: Path, deadline: float) -> None:
        # A directory left by a killed initdb is discarded (PG_VERSION is written early, but
        # initdb removes its directory on failure; this covers a SIGKILLed initdb).
        for child in self.data_dir.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        log.info("initdb into %s", self.data_dir)
        cmd = [
            str(bindir / "initdb"), "-D", str(self.data_dir), "-U", self._os_user,
            "--encoding=UTF8", "--locale=C", "--auth-local=peer", "--auth-host=scram-sha-256",
            "--no-instructions",
        ]  # fmt: skip
        if self.fast_unsafe:
            cmd.append("--no-sync")
        try:
            res = self._run_as_server(cmd, timeout=deadline - time.monotonic())
        except subprocess.TimeoutExpired:
            raise InfraError(f"initdb into {self.data_dir} did not finish in time") from None
        if res.returncode != 0:
            raise InfraError(
                f"initdb failed (exit {res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}"
            )
        conf = self.data_dir / "postgresql.conf"
        with conf.open("a") as f:
            f.write("\n# duetime: settings rewritten on every start\ninclude = 'duetime.conf'\n")
        (self.data_dir / "pg_hba.conf").write_text(
            "# duetime: the server's OS user over the socket; everyone else by password over\n"
            "# TCP on 127.0.0.1 only.\n"
            f"local   all   {self._os_user}   peer\n"
            "host    all   all   127.0.0.1/32   scram-sha-256\n"
        )
        self._chown_to_server(self.data_dir / "pg_hba.conf")

    def _write_conf(self) -> None:
        lines = [
            "# Generated by duetime.infra.local_postgres on every start. Do not edit.",
            "listen_addresses = '127.0.0.1'",
            f"port = {self.port}",
            f"unix_socket_directories = '{self.run_dir}'",
            "max_connections = 200",
            "password_encryption = 'scram-sha-256'",
        ]
        if self.fast_unsafe:
            lines += [
                "# fast_unsafe=True: tests only; a machine crash can corrupt this cluster.",
                "fsync = off",
                "synchronous_commit = off",
                "full_page_writes = off",
            ]
        path = self.data_dir / "duetime.conf"
        path.write_text("\n".join(lines) + "\n")
        self._chown_to_server(path)

    def _chown_to_server(self, path: Path) -> None:
        if self._as_root:
            pw = pwd.getpwnam(self._os_user)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _clear_leftovers(self, deadline: float) -> bool:
        """After a SIGKILLed postmaster: end orphaned backends, remove stale lock files.

        Returns True when a stale postmaster.pid was found.
        """
        pid_file = self.data_dir / "postmaster.pid"
        pid = read_pid_file(pid_file)
        stale = pid is not None and not (pid_alive(pid) and process_name(pid) == "postgres")
        if stale:
            log.info("removing stale %s (pid %s: %s)", pid_file, pid, describe_pid(pid or 0))
            pid_file.unlink(missing_ok=True)
        # The socket lock names the old postmaster too. The server only checks kill(pid, 0),
        # which succeeds for a zombie that init has not reaped yet, so it would refuse to
        # start ("Is another postmaster (PID n) using socket file ...?").
        for lock in self.run_dir.glob(".s.PGSQL.*.lock"):
            lock_pid = read_pid_file(lock)
            if lock_pid is None or not pid_alive(lock_pid):
                log.info("removing stale socket lock %s (pid %s)", lock, lock_pid)
                lock.unlink(missing_ok=True)
        orphans = self._processes_in_data_dir()
        if not orphans:
            return stale
        log.info("waiting for orphaned PostgreSQL processes %s to exit", orphans)
        try:
            wait_until(
                lambda: not self._processes_in_data_dir(),
                min(5.0, max(0.5, deadline - time.monotonic())),
                "orphaned PostgreSQL processes to exit",
            )
        except TimeoutError:
            for p in self._processes_in_data_dir():
                log.warning("killing orphaned PostgreSQL process %d (%s)", p, describe_pid(p))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            wait_until(
                lambda: not self._processes_in_data_dir(),
                5,
                "SIGKILLed orphaned PostgreSQL processes to exit",
            )
        return stale

    def _processes_in_data_dir(self) -> list[int]:
        """Live postgres processes whose working directory is our data directory."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if (
                    (proc / "cwd").resolve() == self.data_dir
                    and process_name(int(proc.name)) == "postgres"
                    and pid_alive(int(proc.name))
                ):
                    found.append(int(proc.name))
        return found

    def _pg_ctl_start(self, bindir: Path, deadline: float) -> None:
        wait_s = max(1, int(deadline - time.monotonic()))
        cmd = [
            str(bindir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file),
            "-w", "-t", str(wait_s), "start",
        ]  # fmt: skip
        log.info("starting PostgreSQL on 127.0.0.1:%d (log: %s)", self.port, self.log_file)
        try:
            res = self._run_as_server(cmd, timeout=wait_s + 5)
            failed = res.returncode != 0
            detail = (res.stdout + res.stderr).strip()
        except subprocess.TimeoutExpired:
            failed, detail = True, f"pg_ctl start did not return within {wait_s + 5} s"
        if failed:
            with contextlib.suppress(InfraError):
                self.stop(timeout_s=10)
            raise InfraError(
                f"PostgreSQL did not start on 127.0.0.1:{self.port}: {detail}\n"
                f"--- last 30 lines of {self.log_file} ---\n{tail(self.log_file)}"
            )

    def _psql(self, script: str, variables: dict[str, str], ok_if: str | None = None) -> str:
        bindir = self.ensure_installed()
        cmd = [
            str(bindir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
            "-h", str(self.run_dir), "-p", str(self.port), "-U", self._os_user, "-d", "postgres",
        ]  # fmt: skip
        for k, v in variables.items():
            cmd += ["-v", f"{k}={v}"]
        if not (bindir / "psql").exists():
            # Debian ships psql in the client package under the same bin dir; fall back to PATH.
            cmd[0] = shutil.which("psql") or cmd[0]
        res = self._run_as_server(cmd, timeout=60, input_text=script)
        if res.returncode != 0 and not (ok_if and ok_if in res.stderr):
            raise InfraError(f"psql failed (exit {res.returncode}): {res.stderr.strip()}")
        return res.stdout

    def _ensure_role(self) -> None:
        sql = (
            "SELECT format('CREATE ROLE %I', :'role') "
            "WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') \\gexec\n"
            "ALTER ROLE :\"role\" WITH LOGIN CREATEDB NOSUPERUSER PASSWORD :'pw';\n"
        )
        self._psql(sql, {"role": self.user, "pw": self.password}, ok_if="already exists")

    def _answers_select_1(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url("postgres"), connect_timeout=2) as conn:
                return conn.execute("select 1").fetchone() == (1,)
        except psycopg.Error:
            return False
