"""Who a job runs as, what it may use, and what of the server it can see.

A job running as the server's user can read the database, mint tokens, read the server's
environment and signal every other job. So, where the server is root, each team's jobs
run as that team's own unprivileged user (mapped by configuration, else created as
`gpupool-<team>` without login shell or home), the state directory and database are
readable by the server alone, and each job reaches only its own run directory's
checkpoint/ and home/ (its own) and logs (readable). The `isolation:` section of the
`gpupool serve --config` file sets this up, with the per-kind and per-team cgroup limits
and the log cap:

    isolation:
      enabled: true            # default: true when the server runs as root
      create_users: true       # useradd gpupool-<team> for teams not listed in users
      users: {research: alice} # team -> an existing user
      log_max_mib: 64          # each of a job's logs, one rotated .1 kept
      limits:
        defaults: {training: {cpu: 8, mem_mib: 65536, pids: 4096}}
        teams: {research: {mem_mib: 131072}}
"""

from __future__ import annotations

import dataclasses
import grp
import hashlib
import os
import pwd
import re
import stat
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpupool.domain.model import JobKind
from gpupool.errors import SpecError, Unavailable
from gpupool.ports.executor.base import JobUser, Limits
from gpupool.server.executors.files import DEFAULT_LOG_MAX_BYTES
from gpupool.specfile import SpecReader, config_section

SECTION = "isolation"
USER_PREFIX = "gpupool-"
KEYS = frozenset({"enabled", "create_users", "users", "log_max_mib", "limits"})
LIMIT_KEYS = frozenset({"cpu", "mem_mib", "pids"})
DEFAULT_PIDS = 4096
"""A fork bomb stops here; a data loader with many workers stays well below."""


@dataclass(frozen=True)
class IsolationConfig:
    """The `isolation:` section. enabled None: on when the server runs as root."""

    enabled: bool | None = None
    create_users: bool = True
    users: Mapping[str, str] = field(default_factory=dict)
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    kind_limits: Mapping[str, Limits] = field(default_factory=dict)
    team_limits: Mapping[str, Limits] = field(default_factory=dict)


def _limits(reader: SpecReader, value: Any, where: str) -> Limits:
    m = reader.mapping(value, where, LIMIT_KEYS)
    cpu, mem, pids = m.get("cpu"), m.get("mem_mib"), m.get("pids")
    if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, int | float) or cpu <= 0):
        raise reader.fail(f"{where}.cpu", f"give a positive number of cores, got {cpu!r}")
    for key, v in (("mem_mib", mem), ("pids", pids)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise reader.fail(f"{where}.{key}", f"give a positive whole number, got {v!r}")
    return Limits(float(cpu) if cpu is not None else None, mem, pids)


def parse_isolation(raw: Any, source: str) -> IsolationConfig:
    """The `isolation:` mapping of the service config (None: all defaults)."""
    if raw is None:
        return IsolationConfig()
    reader = SpecReader(source)
    m = reader.mapping(raw, SECTION, KEYS)
    enabled = m.get("enabled")
    if enabled is not None and not isinstance(enabled, bool):
        raise reader.fail(f"{SECTION}.enabled", f"true or false, got {enabled!r}")
    create = m.get("create_users", True)
    if not isinstance(create, bool):
        raise reader.fail(f"{SECTION}.create_users", f"true or false, got {create!r}")
    users = m.get("users") or {}
    if not isinstance(users, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in users.items()
    ):
        raise reader.fail(f"{SECTION}.users", "a mapping of team: existing Unix user name")
    cap = m.get("log_max_mib", DEFAULT_LOG_MAX_BYTES >> 20)
    if isinstance(cap, bool) or not isinstance(cap, int | float) or cap <= 0:
        raise reader.fail(f"{SECTION}.log_max_mib", f"a positive number of MiB, got {cap!r}")
    limits = reader.mapping(m.get("limits") or {}, f"{SECTION}.limits", {"defaults", "teams"})
    kinds = reader.mapping(
        limits.get("defaults") or {}, f"{SECTION}.limits.defaults", {k.value for k in JobKind}
    )
    teams = limits.get("teams") or {}
    if not isinstance(teams, Mapping):
        raise reader.fail(f"{SECTION}.limits.teams", "a mapping of team: limits")
    return IsolationConfig(
        enabled=enabled,
        create_users=create,
        users=dict(users),
        log_max_bytes=int(cap * (1 << 20)),
        kind_limits={
            k: _limits(reader, v, f"{SECTION}.limits.defaults.{k}") for k, v in kinds.items()
        },
        team_limits={
            str(t): _limits(reader, v, f"{SECTION}.limits.teams.{t}") for t, v in teams.items()
        },
    )


def load_isolation(path: Path | None) -> IsolationConfig:
    """The `isolation:` section of the `--config` file (defaults when absent)."""
    return parse_isolation(config_section(path, SECTION), str(path))


def user_name_for(team: str) -> str:
    """`gpupool-<team>`, made a valid user name (lowercase, at most 32 characters); a
    short hash of the team keeps two teams that differ in spelling apart."""
    clean = re.sub(r"[^a-z0-9_-]", "_", team.lower())
    name = USER_PREFIX + clean
    if clean != team or len(name) > 32:
        digest = hashlib.sha256(team.encode()).hexdigest()[:8]
        name = f"{USER_PREFIX}{clean[:15]}-{digest}"
    return name


DERIVED_ID_BASE = 3_000_000
DERIVED_ID_SPAN = 1_000_000


def derived_id(name: str) -> int:
    """The uid (and gid) a job user created by gpupool gets: from its name alone, so every
    machine that creates it gives it the same ids, outside the ranges that useradd hands
    out by itself."""
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    return DERIVED_ID_BASE + digest % DERIVED_ID_SPAN


class UserDirectory(Protocol):
    """The system's users: look one up, create one."""

    def lookup(self, name: str) -> JobUser | None: ...

    def create(self, name: str) -> JobUser: ...

    def create_with(self, user: JobUser) -> JobUser:
        """Create `user.name` with exactly `user.uid` and `user.gid` (a node agreeing with
        the server); returns what the system then says of the name."""
        ...


class SystemUsers:
    """/etc/passwd through pwd; new users with useradd (a system user with its own group
    of the same id, no home directory, no login shell)."""

    def lookup(self, name: str) -> JobUser | None:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        return JobUser(name, entry.pw_uid, entry.pw_gid)

    def create(self, name: str) -> JobUser:
        """With the ids `derived_id` gives the name: the same on every machine, so a
        team's files on shared storage are its own wherever they are read."""
        uid = derived_id(name)
        try:
            holder = pwd.getpwuid(uid).pw_name
        except KeyError:
            holder = None
        if holder is not None and holder != name:
            raise Unavailable(
                f"cannot create the job user {name}: its uid {uid} (derived from the name, "
                f"the same on every machine) belongs to {holder} here; map the team to an "
                "existing user under isolation.users"
            )
        return self.create_with(JobUser(name, uid, uid))

    def create_with(self, user: JobUser) -> JobUser:
        shell = next(
            (s for s in ("/usr/sbin/nologin", "/sbin/nologin") if Path(s).exists()), "/bin/false"
        )
        try:
            grp.getgrgid(user.gid)
        except KeyError:
            _run(["groupadd", "--system", "--gid", str(user.gid), user.name], user.name)
        argv = ["useradd", "--system", "--no-create-home", "--no-log-init", "--uid"]
        argv += [str(user.uid), "--gid", str(user.gid), "--home-dir", "/nonexistent"]
        _run([*argv, "--shell", shell, user.name], user.name)
        found = self.lookup(user.name)
        if found is None:
            raise Unavailable(
                f"cannot create the job user {user.name} (uid {user.uid}) on this node: "
                "create it yourself with the same ids as on the server"
            )
        return found


def _run(argv: list[str], name: str) -> None:
    """Run useradd or groupadd; what it says when it fails goes into the caller's error
    (another agent creating the same user meanwhile is no failure: the lookup tells)."""
    try:
        subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise Unavailable(f"cannot create the job user {name}: {err}") from err


class FakeUsers:
    """Users in memory, numbered from 50 000 (tests that need no real accounts)."""

    def __init__(self, existing: Mapping[str, int] | None = None) -> None:
        self.users = {n: JobUser(n, uid, uid) for n, uid in (existing or {}).items()}
        self.created: list[str] = []

    def lookup(self, name: str) -> JobUser | None:
        return self.users.get(name)

    def create(self, name: str) -> JobUser:
        user = JobUser(name, 50_000 + len(self.users), 50_000 + len(self.users))
        self.users[name] = user
        self.created.append(name)
        return user

    def create_with(self, user: JobUser) -> JobUser:
        self.users[user.name] = user
        self.created.append(user.name)
        return user


def agree_user(user: JobUser, node: str, users: UserDirectory | None = None) -> None:
    """Make `user` exist on this machine with the uid and gid the server gave it: created
    with exactly those where it is missing; refused, with the reason, where this
    machine's user table gives the name other ids (files on shared storage would then
    belong to someone else)."""
    directory = users if users is not None else SystemUsers()
    here = directory.lookup(user.name)
    if here is None:
        here = directory.create_with(user)
    if (here.uid, here.gid) != (user.uid, user.gid):
        raise SpecError(
            f"node {node}'s user table disagrees with the server's: {user.name} is uid "
            f"{here.uid} gid {here.gid} there, uid {user.uid} gid {user.gid} on the server; "
            "give the user the same ids on every machine (or map the team under "
            "isolation.users to a user that has them)"
        )


class Isolation:
    """The policy in force: each team's user (when enabled) and each job's limits."""

    def __init__(
        self,
        config: IsolationConfig,
        *,
        is_root: bool | None = None,
        users: UserDirectory | None = None,
    ) -> None:
        root = os.geteuid() == 0 if is_root is None else is_root
        self.config = config
        self.enabled = root if config.enabled is None else config.enabled
        if self.enabled and not root:
            raise SpecError(
                "isolation is on but the server does not run as root, so it cannot run "
                "jobs as their teams' users: run `gpupool serve` as root, or set "
                "`isolation: {enabled: false}` (or --no-isolation) and accept that every "
                "job then runs as the server's user, able to read its database and files"
            )
        self.users = users if users is not None else SystemUsers()
        self._by_team: dict[str, JobUser] = {}
        self._lock = threading.Lock()

    @property
    def log_max_bytes(self) -> int:
        return self.config.log_max_bytes

    def user_for(self, team: str) -> JobUser | None:
        """The user `team`'s jobs run as (found or created once); None when disabled."""
        if not self.enabled:
            return None
        with self._lock:
            known = self._by_team.get(team)
            if known is not None:
                return known
            mapped = self.config.users.get(team)
            name = mapped or user_name_for(team)
            user = self.users.lookup(name)
            if user is None:
                if mapped is not None or not self.config.create_users:
                    raise SpecError(
                        f"team {team}'s jobs run as the Unix user {name}, which does not "
                        "exist: create it, or map the team to another user under "
                        "isolation.users"
                    )
                user = self.users.create(name)
            if user.uid == 0:
                raise SpecError(
                    f"team {team} is mapped to {name}, which is root: map it to an "
                    "unprivileged user under isolation.users"
                )
            self._by_team[team] = user
            return user

    def limits_for(self, team: str, kind: str) -> Limits:
        """The team's limits over its kind's defaults over the built-in pids limit."""
        base = Limits(pids=DEFAULT_PIDS)
        kind_limits = self.config.kind_limits.get(kind, Limits()).over(base)
        return self.config.team_limits.get(team, Limits()).over(kind_limits)

    def secure_state(self, state_dir: Path, jobs_dir: Path, db_file: Path | None) -> None:
        """The server alone reads its state: new files 0600 (umask), the state and jobs
        directories traversable only (0711: a job reaches its own run directory by name),
        the SQLite database and anything else at the top of the state dir 0600. Refuses
        to start when the jobs cannot reach their directories at all."""
        if not self.enabled:
            return
        os.umask(0o077)
        for d in (state_dir, jobs_dir):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o711)
        for entry in state_dir.iterdir():
            if entry.is_file() and not entry.is_symlink():
                os.chmod(entry, stat.S_IMODE(entry.stat().st_mode) & 0o700)
        if db_file is not None:
            for suffix in ("", "-wal", "-shm", "-journal"):
                path = db_file.with_name(db_file.name + suffix)
                if path.is_file():
                    os.chmod(path, 0o600)
        for parent in jobs_dir.absolute().parents:
            if not parent.stat().st_mode & stat.S_IXOTH:
                raise SpecError(
                    f"jobs would run as their teams' users but cannot reach their "
                    f"directories under {jobs_dir}: {parent} is not searchable by others "
                    f"(chmod o+x {parent}), or choose a --state-dir elsewhere"
                )

    def cannot_guarantee(self) -> list[str]:
        if self.enabled:
            return []
        return [
            "isolation is off: every job runs as the server's user and can read the "
            "database, the state directory, other jobs' logs and checkpoints, and signal "
            "other jobs (the job's environment is still only the allowed variables)"
        ]


def sqlite_file(url: str) -> Path | None:
    """The database file of a sqlite:/// URL; None for any other database."""
    prefix = "sqlite:///"
    return Path(url[len(prefix) :]) if url.startswith(prefix) else None


def service_isolation(config_path: Path | None, off: bool, demo: bool = False) -> Isolation:
    """What `gpupool serve` runs jobs under: the --config file's `isolation:` section,
    turned off by --no-isolation, and by --demo unless the file turns it on (the demo's
    jobs run gpupool's own interpreter, which a team's user may not be allowed to run).
    On Ray, each node's agent contains the jobs it starts the same way, and creates the
    team users with the same ids as here (`agree_user`).
    Call `secure_state` before any job starts."""
    config = load_isolation(config_path)
    if off or (demo and config.enabled is None):
        config = dataclasses.replace(config, enabled=False)
    return Isolation(config)
