"""The aclfile on disk: read at start and by ACL LOAD, rewritten by ACL SAVE and whenever a
user changes (here or from a peer), so the users a node holds survive its restart.

The format is Redis's: one ``user <name> <rules>`` per line, passwords as ``#<sha256>``.
A file is replaced atomically (written beside it, fsynced, renamed).
"""

from __future__ import annotations

import logging
import os

from broker.acl import User
from broker.acl_users import Users, parse_lines

log = logging.getLogger(__name__)


class AclFileError(Exception):
    pass


def read(path: str) -> list[User]:
    """The file's users; a missing file has none. Raises AclFileError on a bad line."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise AclFileError(f"cannot read the aclfile {path}: {exc.strerror}") from exc
    users = parse_lines(lines)
    if isinstance(users, str):
        raise AclFileError(f"{path}: {users}")
    return users


def write(path: str, users: Users) -> None:
    """Every user to ``path``, atomically. Raises AclFileError."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write("".join(line + "\n" for line in users.lines()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise AclFileError(f"cannot write the aclfile {path}: {exc.strerror}") from exc


def path_of(dir_: str, aclfile: str) -> str:
    return aclfile if os.path.isabs(aclfile) else os.path.join(dir_, aclfile)


def keep_saved(path: str, users: Users) -> None:
    """Rewrite ``path`` after every change of ``users``; a failure is logged (the users stay
    in memory and the cluster; ACL SAVE reports the error to its client)."""
    def changed(name: str, user: User | None) -> None:
        try:
            write(path, users)
        except AclFileError as exc:
            log.warning("%s", exc)
    users.changed.append(changed)
