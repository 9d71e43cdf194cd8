"""The Unix users jobs run as: whether a job's owner is one on this machine, whether the engine
runs each job as its owner (`run_as_owner`), where `~` is for that user (`expand_home`), and
whether a user is in a Unix group (the shared engine's admins). Whether a folder is open to a user is never read here from mode bits as
root: the engine asks as the user (`engine/userfiles.py`).

Only a root engine can start a process as another user; a personal engine (not root) runs
every job as itself, as before.
"""

from __future__ import annotations

import grp
import os
import pwd
import time

RUN_AS_MODES = ("auto", "always", "never")


class NotAUnixUser(LookupError):
    """The job's owner has no account on this machine."""

    def __init__(self, user: str):
        super().__init__(f"the job's owner {user!r} is not a Unix user on this machine")
        self.user = user


_CACHE_S = 60.0
_cache: dict[str, tuple[float, pwd.struct_passwd | None]] = {}


def lookup(name: str) -> pwd.struct_passwd | None:
    """The passwd entry of `name`, or None; remembered for a minute (a lookup of a name that is
    not a user can cost a quarter of a millisecond, on every submission)."""
    now = time.monotonic()
    hit = _cache.get(name)
    if hit is not None and now - hit[0] < _CACHE_S:
        return hit[1]
    try:
        entry: pwd.struct_passwd | None = pwd.getpwnam(name)
    except KeyError:
        entry = None
    if len(_cache) > 10_000:
        _cache.clear()
    _cache[name] = (now, entry)
    return entry


_groups_cache: dict[tuple[str, int], tuple[float, list[int]]] = {}


def account(name: str | None) -> list[object] | None:
    """What a supervisor needs to become Unix user `name`: [name, uid, gid, home, shell,
    [gids]], resolved here (and remembered for a minute) so that starting a job does no user
    or group lookup of its own; None for the engine's own user. KeyError: no such user."""
    if not name:
        return None
    entry = lookup(name)
    if entry is None:
        raise KeyError(name)
    if entry.pw_uid == os.getuid():
        return None
    now = time.monotonic()
    key = (entry.pw_name, entry.pw_gid)
    hit = _groups_cache.get(key)
    if hit is None or now - hit[0] >= _CACHE_S:
        hit = (now, os.getgrouplist(entry.pw_name, entry.pw_gid))
        _groups_cache[key] = hit
    return [entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, entry.pw_shell, list(hit[1])]


def run_as(owner: str, mode: str = "auto") -> str | None:
    """The Unix user to run `owner`'s job as, or None for the engine's own user.

    "auto": the owner, when the engine runs as root and the owner is a Unix user here other
    than root; "always": the owner (NotAUnixUser when there is none); "never": None."""
    if mode == "never" or (mode == "auto" and os.geteuid() != 0):
        return None
    entry = lookup(owner)
    if entry is None:
        if mode == "always":
            raise NotAUnixUser(owner)
        return None
    if entry.pw_uid == os.geteuid():
        return None
    return entry.pw_name


def expand_home(path: str, unix_user: str | None) -> str | None:
    """`path` with a leading `~` (or `~name`) made the home folder of `unix_user` (None: the
    engine's own user, whom the job then runs as) or of `name`, never root's home for another
    user's path; None when the user named has no home here. Other paths come back as given."""
    if not path.startswith("~"):
        return path
    head, sep, rest = path.partition("/")
    name = head[1:] or unix_user
    if name is None:
        home = os.path.expanduser("~")
        return None if home == "~" else home + sep + rest
    entry = lookup(name)
    if entry is None or not entry.pw_dir:
        return None
    return entry.pw_dir.rstrip("/") + sep + rest if entry.pw_dir != "/" else "/" + rest


def in_group(user: str, group: str) -> bool:
    """Whether `user` is a member of Unix group `group`, as a supplementary or primary group."""
    entry = lookup(user)
    if entry is None:
        return False
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return False
    return gid in os.getgrouplist(entry.pw_name, entry.pw_gid)
