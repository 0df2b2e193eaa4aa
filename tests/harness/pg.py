"""A real PostgreSQL for the tests (Debian's postgresql package): `initdb` in a temporary
directory, run as an unprivileged user (the server refuses to run as root), on a free loopback
port with password authentication. Each test gets a database of its own (`new_database`)."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

PASSWORD = "gpufleet-test-password"


def _binary(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        raise RuntimeError(
            f"PostgreSQL's {name} is not installed: scripts/install-test-deps.sh installs Debian's postgresql"
        )
    return found[-1]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SKEWED_CLOCK_SOURCE = Path(__file__).with_name("skewed_clock.c")  # a wall clock moved by an offset


class PostgresServer:
    def __init__(self, clock_offset_s: int = 0) -> None:
        """clock_offset_s: the server's wall clock is this far from the machine's
        (harness/skewed_clock.c, preloaded into every server process; its monotonic clock is
        left alone), so that what PostgreSQL's clock_timestamp() says differs from what the
        replicas' clocks say."""
        self.clock_offset_s = clock_offset_s
        self.home = Path(tempfile.mkdtemp(prefix="gpufleet-pg-"))
        self.data = self.home / "data"
        self.port = _free_port()
        self._user: str | None = None
        if os.geteuid() == 0:
            self._user = "postgres" if _has_user("postgres") else "nobody"
            entry = pwd.getpwnam(self._user)
            os.chown(self.home, entry.pw_uid, entry.pw_gid)
        pwfile = self.home / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self._user:
            os.chown(pwfile, pwd.getpwnam(self._user).pw_uid, -1)
        self._run(
            [
                _binary("initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                f"--pwfile={pwfile}",
                "--no-sync",
                "-E",
                "UTF8",
            ]
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.dbs = 0

    def _as_user(self, argv: list[str]) -> list[str]:
        """argv run as the unprivileged user (PostgreSQL refuses root) through setpriv, which
        execs it in place (same pid: a test's SIGSTOP reaches postgres itself). Not Popen's
        user=: that makes Python fork() the test process, and a fork of a process with gRPC's
        threads running runs gRPC's fork handlers in the child, which killed the child before
        exec when the suite ran in workers (`postgres did not start`, its log holding gRPC's
        "epoll_wait error: Bad file descriptor"). Without user=, Python starts it by vfork."""
        if not self._user:
            return argv
        entry = pwd.getpwnam(self._user)
        return ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--", *argv]

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(self._as_user(argv), capture_output=True, text=True, cwd=self.home)
        if done.returncode:
            raise RuntimeError(f"{argv[0]} failed: {done.stdout}{done.stderr}")

    def start(self) -> None:
        log = open(self.home / "postgres.log", "ab")  # noqa: SIM115 - the server's, kept open
        self.proc = subprocess.Popen(
            self._as_user(
                [
                    _binary("postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.home),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "max_connections=200",
                    "-c",
                    "shared_buffers=32MB",
                ]
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.home,
            env=self._env(),
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not start: {self.log()[-2000:]}") from None
                time.sleep(0.1)

    def _env(self) -> dict[str, str] | None:
        if not self.clock_offset_s:
            return None
        return {
            **os.environ,
            "LD_PRELOAD": str(self._skewed_clock()),
            "GPUFLEET_CLOCK_OFFSET_S": str(self.clock_offset_s),
        }

    def _skewed_clock(self) -> Path:
        """harness/skewed_clock.c, built for this server (why not libfaketime: its header)."""
        compiler = shutil.which("cc") or shutil.which("gcc")
        if not compiler:
            raise RuntimeError("no C compiler (cc): scripts/install-test-deps.sh installs Debian's gcc")
        built = self.home / "skewed_clock.so"
        done = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(built), str(SKEWED_CLOCK_SOURCE), "-ldl"],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise RuntimeError(f"building {SKEWED_CLOCK_SOURCE} failed: {done.stdout}{done.stderr}")
        return built

    def now_offset_s(self) -> float:
        """How far the server's clock is from this machine's now, as the server says."""
        with psycopg.connect(self.url("postgres"), connect_timeout=5) as conn:
            row = conn.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()
        assert row is not None
        return float(row[0]) - time.time()

    def log(self) -> str:
        return (self.home / "postgres.log").read_text(errors="replace")

    def url(self, database: str, user: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        self.dbs += 1
        name = f"t{os.getpid()}_{self.dbs}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop a test's database (its sessions ended by force), so a long session of tests
        does not pile up hundreds of them for the shutdown checkpoint to write."""
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")  # type: ignore[arg-type]

    def processes(self) -> list[int]:
        """The postmaster and every process it started (backends, checkpointer, walwriter...)."""
        assert self.proc is not None, "the server is not running"
        pids, children = [self.proc.pid], {}
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
        for pid in pids:
            pids.extend(children.get(pid, []))
        return pids

    def pause(self) -> list[int]:
        """SIGSTOP every process of the server: a hang (connections stay open, nothing answers)."""
        pids = self.processes()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    def resume(self, pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def stop(self, sig: int = signal.SIGINT) -> None:
        """SIGINT: PostgreSQL's fast shutdown (clients are disconnected; SIGTERM would wait
        for them); SIGKILL: a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
        self.proc = None

    def cleanup(self) -> None:
        # Immediate shutdown: the data is thrown away, so no checkpoint need be written first.
        self.stop(signal.SIGQUIT)
        shutil.rmtree(self.home, ignore_errors=True)


def sessions_report(url: str) -> str:
    """What every session of the server is doing, which sessions block which, and what the
    kernel says each blocking backend waits in: said when a test waits in vain for a lock (a
    takeover that never comes), so the failure names the session that holds it."""
    try:
        with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid, application_name, state, wait_event_type, wait_event, "
                "pg_blocking_pids(pid), now() - xact_start, now() - state_change, left(query, 120) "
                "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "ORDER BY pid"
            ).fetchall()
    except psycopg.Error as exc:
        return f"no report from the server: {exc}"
    blockers = {b for row in rows for b in row[5]}
    lines = []
    for pid, app, state, wait_type, wait, blocked_by, in_xact, in_state, query in rows:
        kernel = ""
        if pid in blockers:
            try:
                kernel = f" kernel: {Path(f'/proc/{pid}/wchan').read_text() or 'running'}"
            except OSError:
                kernel = " kernel: gone"
        lines.append(
            f"pid {pid} {app!r} {state} wait {wait_type}/{wait} blocked by {blocked_by} "
            f"transaction {in_xact} state {in_state}{kernel}: {query}"
        )
    return "\n".join(lines) or "no other sessions"


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
