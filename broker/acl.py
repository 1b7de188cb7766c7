"""ACL users and their rules, as Redis 6/7's ACL SETUSER reads them: pure, no I/O.

Queues play the part of Redis's keys. A ``User`` holds its passwords (SHA-256 hex, as Redis
stores them), the commands it may run (command IDs: a row's name, or ``name|sub`` for a
subcommand whose categories differ from its command's) and its queue patterns. ``apply``
reads one rule and returns the parser's error text or None; ``describe`` writes a user back
as rules that ``apply`` reads to the same user (ACL LIST, ACL GETUSER, the aclfile).

``CATALOG`` is what the rules name: every command ID and its categories, filled by the
command table (``broker/command_table.py``) as it is built, so the table stays the one place
that says which categories a command has.

``User.restricted`` is the one flag the broker tests per command: False for a user who may
run everything on every queue (the default user, unless an operator narrows it).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Final

# The categories a row may name; ``@all`` is every command.
CATEGORIES: Final = ("read", "write", "admin", "dangerous", "jobs", "queues", "cluster",
                     "slow", "fast", "connection")

SYNTAX: Final = "Syntax error"
UNKNOWN_COMMAND: Final = "Unknown command or category name in ACL"
NO_SUCH_PASSWORD: Final = "The password you are trying to remove from the user does not exist"
BAD_HASH: Final = ("The password hash must be exactly 64 characters and contain only "
                   "lowercase hexadecimal characters")
PATTERN_AFTER_ALL: Final = ("Adding a pattern after the * pattern (or the 'allkeys' flag) is "
                            "not valid and does not have any effect. Try 'resetkeys' to start "
                            "with an empty list of patterns")
BAD_NAME: Final = "Usernames can't contain spaces or null characters"


class Catalog:
    """Command IDs and their categories."""

    def __init__(self) -> None:
        self.categories: dict[str, frozenset[str]] = {}  # command ID -> categories
        self.by_category: dict[str, set[str]] = {c: set() for c in CATEGORIES}
        self.subs: dict[str, list[str]] = {}  # command -> its own IDs (itself and its subs)

    def add(self, name: str, categories: str, subs: dict[str, str] | None = None) -> None:
        ids = [name]
        self._add_id(name, categories)
        for sub, cats in (subs or {}).items():
            ids.append(name + "|" + sub)
            self._add_id(name + "|" + sub, cats)
        self.subs[name] = ids

    def _add_id(self, cid: str, categories: str) -> None:
        cats = frozenset(c.lstrip("@") for c in categories.split())
        unknown = cats - set(CATEGORIES)
        if unknown:
            raise ValueError(f"{cid}: unknown categories {sorted(unknown)}")
        self.categories[cid] = cats
        for c in cats:
            self.by_category[c].add(cid)

    def command_id(self, name: str, first_arg: str) -> str:
        """The ID a call of ``name`` with ``first_arg`` is checked against."""
        cid = name + "|" + first_arg
        return cid if cid in self.categories else name


CATALOG: Final = Catalog()


def sha256_hex(password: bytes) -> str:
    return hashlib.sha256(password).hexdigest()


_HEX64: Final = re.compile(r"[0-9a-f]{64}")


def glob_regex(pattern: bytes) -> re.Pattern[bytes]:
    """Redis's glob (``*``, ``?``, ``[abc]``, ``[^a-z]``, ``\\x``) as a regular expression."""
    out = bytearray()
    i = 0
    n = len(pattern)
    while i < n:
        c = pattern[i:i + 1]
        if c == b"*":
            out += b".*"
        elif c == b"?":
            out += b"."
        elif c == b"\\" and i + 1 < n:
            i += 1
            out += re.escape(pattern[i:i + 1])
        elif c == b"[":
            j = pattern.find(b"]", i + 1)
            if j < 0:
                out += re.escape(c)
            else:
                body = pattern[i + 1:j]
                neg = body.startswith(b"^")
                if neg:
                    body = body[1:]
                parts = bytearray()
                k = 0
                while k < len(body):
                    if body[k:k + 1] == b"\\" and k + 1 < len(body):
                        k += 1
                    if k + 2 < len(body) and body[k + 1:k + 2] == b"-":
                        lo, hi = sorted((body[k], body[k + 2]))
                        parts += re.escape(bytes((lo,))) + b"-" + re.escape(bytes((hi,)))
                        k += 3
                    else:
                        parts += re.escape(body[k:k + 1])
                        k += 1
                if not parts:
                    out += b"[^\\s\\S]" if not neg else b"[\\s\\S]"
                else:
                    out += b"[" + (b"^" if neg else b"") + bytes(parts) + b"]"
                i = j
        else:
            out += re.escape(c)
        i += 1
    return re.compile(bytes(out), re.DOTALL)


class User:
    __slots__ = ("name", "enabled", "nopass", "passwords", "allowed", "allowed_subs",
                 "denied_subs", "command_rules", "all_commands", "patterns", "regexes",
                 "all_queues", "restricted", "deleted")

    def __init__(self, name: str) -> None:
        self.name = name
        self.enabled = False
        self.nopass = False
        self.passwords: list[str] = []  # SHA-256 hex, in the order added
        self.allowed: set[str] = set()  # command IDs
        self.allowed_subs: set[str] = set()  # "command|first-arg" allowed one by one
        self.denied_subs: set[str] = set()  # "command|first-arg" taken back one by one
        # The command rules since the last +@all or -@all: what describe() writes back.
        self.command_rules: list[str] = []
        self.all_commands = False  # the last base was +@all
        self.patterns: list[bytes] = []
        self.regexes: list[re.Pattern[bytes]] = []
        self.all_queues = False
        self.restricted = True
        self.deleted = False  # ACL DELUSER: its connected clients may run nothing

    def copy(self) -> User:
        u = User(self.name)
        u.enabled, u.nopass, u.passwords = self.enabled, self.nopass, list(self.passwords)
        u.allowed, u.allowed_subs = set(self.allowed), set(self.allowed_subs)
        u.denied_subs, u.command_rules = set(self.denied_subs), list(self.command_rules)
        u.all_commands, u.patterns = self.all_commands, list(self.patterns)
        u.regexes, u.all_queues = list(self.regexes), self.all_queues
        u.refresh()
        return u

    def take(self, other: User) -> None:
        """Become ``other`` (ACL SETUSER on a user whose clients hold this object)."""
        self.enabled, self.nopass, self.passwords = other.enabled, other.nopass, other.passwords
        self.allowed, self.allowed_subs = other.allowed, other.allowed_subs
        self.denied_subs, self.command_rules = other.denied_subs, other.command_rules
        self.all_commands, self.patterns = other.all_commands, other.patterns
        self.regexes, self.all_queues = other.regexes, other.all_queues
        self.deleted = False
        self.refresh()

    def refresh(self) -> None:
        self.restricted = (self.deleted or not self.all_queues or self.bool_denied())

    def bool_denied(self) -> bool:
        return bool(self.denied_subs) or len(self.allowed) != len(CATALOG.categories)

    # -- checks ---------------------------------------------------------------------------

    def may_run(self, name: str, first_arg: str) -> bool:
        if self.deleted:
            return False
        pair = name + "|" + first_arg
        if pair in self.denied_subs:
            return False
        return CATALOG.command_id(name, first_arg) in self.allowed or pair in self.allowed_subs

    def may_use(self, queue: bytes) -> bool:
        if self.all_queues:
            return True
        return any(r.fullmatch(queue) is not None for r in self.regexes)

    def password_ok(self, password: bytes) -> bool:
        if not self.enabled:
            return False
        if self.nopass:
            return True
        given = sha256_hex(password)
        ok = False
        for stored in self.passwords:  # every one compared: no early exit on a match
            ok = _same(stored, given) or ok
        return ok


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def new_user(name: str) -> User:
    """A user as ACL SETUSER creates it: off, no password, no commands, no queues."""
    return User(name)


def default_user() -> User:
    """The ``default`` user as a node starts: on, nopass, every command on every queue."""
    u = User("default")
    for rule in ("on", "nopass", "allkeys", "allcommands"):
        apply(u, rule)
    return u


def valid_name(name: bytes) -> bool:
    return bool(name) and not any(c <= 32 or c == 127 for c in name)


def apply(user: User, raw: str) -> str | None:
    """Apply one rule to ``user`` in place; the error text, or None."""
    rule = raw.lower() if raw[:1] not in ("<", ">", "#", "!", "~") else raw
    error = _apply(user, rule, raw)
    user.refresh()
    return error


def _apply(user: User, rule: str, raw: str) -> str | None:
    if rule == "on":
        user.enabled = True
    elif rule == "off":
        user.enabled = False
    elif rule == "nopass":
        user.nopass = True
        user.passwords.clear()
    elif rule == "resetpass":
        user.nopass = False
        user.passwords.clear()
    elif rule[:1] in (">", "#"):
        digest = sha256_hex(raw[1:].encode("utf-8", "surrogateescape")) if rule[0] == ">" \
            else rule[1:]
        if rule[0] == "#" and _HEX64.fullmatch(digest) is None:
            return BAD_HASH
        if digest not in user.passwords:
            user.passwords.append(digest)
        user.nopass = False
    elif rule[:1] in ("<", "!"):
        digest = sha256_hex(raw[1:].encode("utf-8", "surrogateescape")) if rule[0] == "<" \
            else rule[1:]
        if rule[0] == "!" and _HEX64.fullmatch(digest) is None:
            return BAD_HASH
        if digest not in user.passwords:
            return NO_SUCH_PASSWORD
        user.passwords.remove(digest)
    elif rule in ("allkeys", "~*"):
        user.all_queues = True
        user.patterns = [b"*"]
        user.regexes = [glob_regex(b"*")]
    elif rule == "resetkeys":
        user.all_queues = False
        user.patterns = []
        user.regexes = []
    elif rule[:1] == "~":
        if user.all_queues:
            return PATTERN_AFTER_ALL
        pattern = raw[1:].encode("utf-8", "surrogateescape")
        if pattern not in user.patterns:
            user.patterns.append(pattern)
            user.regexes.append(glob_regex(pattern))
    elif rule in ("allchannels", "resetchannels") or rule[:1] == "&":
        pass  # trisque has no channels: accepted so Redis's tools and ACL files work
    elif rule == "reset":
        for r in ("resetpass", "resetkeys", "off", "-@all"):
            _apply(user, r, r)
    elif rule in ("allcommands", "+@all"):
        user.allowed = set(CATALOG.categories)
        user.allowed_subs.clear()
        user.denied_subs.clear()
        user.command_rules = []
        user.all_commands = True
    elif rule in ("nocommands", "-@all"):
        user.allowed = set()
        user.allowed_subs.clear()
        user.denied_subs.clear()
        user.command_rules = []
        user.all_commands = False
    elif rule[:1] in ("+", "-") and len(rule) > 1:
        error = _command_rule(user, rule[0] == "+", rule[1:])
        if error is not None:
            return error
        user.command_rules.append(rule)
    else:
        return SYNTAX
    return None


def _command_rule(user: User, add: bool, what: str) -> str | None:
    if what.startswith("@"):
        ids = CATALOG.by_category.get(what[1:])
        if ids is None:
            return UNKNOWN_COMMAND
        if add:
            user.allowed |= ids
        else:
            user.allowed -= ids
        return None
    name, bar, sub = what.partition("|")
    if name not in CATALOG.subs or (bar and (not sub or "|" in sub)):
        return UNKNOWN_COMMAND
    if bar:
        pair = name + "|" + sub
        if pair in CATALOG.categories:  # a subcommand with an ID of its own
            (user.allowed.add if add else user.allowed.discard)(pair)
        (user.allowed_subs.add if add else user.allowed_subs.discard)(pair)
        (user.denied_subs.discard if add else user.denied_subs.add)(pair)
        return None
    prefix = name + "|"
    for cid in CATALOG.subs[name]:
        (user.allowed.add if add else user.allowed.discard)(cid)
    user.allowed_subs = {p for p in user.allowed_subs if not p.startswith(prefix)}
    user.denied_subs = {p for p in user.denied_subs if not p.startswith(prefix)}
    return None


def apply_all(user: User, rules: list[str]) -> tuple[str, str] | None:
    """Apply ``rules`` to ``user`` in order: ``(rule, error)`` of the first that fails (the
    user is then half changed: callers work on a copy), or None."""
    for rule in rules:
        error = apply(user, rule)
        if error is not None:
            return rule, error
    return None


def describe(user: User) -> list[str]:
    """``user`` as rules: applied to a new user they give the same one."""
    rules = ["on" if user.enabled else "off"]
    if user.nopass:
        rules.append("nopass")
    rules.extend("#" + p for p in user.passwords)
    if user.all_queues:
        rules.append("~*")
    else:
        rules.extend("~" + p.decode("utf-8", "surrogateescape") for p in user.patterns)
    rules.append("resetchannels")
    rules.append("+@all" if user.all_commands else "-@all")
    rules.extend(user.command_rules)
    return rules


def command_text(user: User) -> str:
    """The command part of ``describe`` (ACL GETUSER's ``commands``)."""
    return " ".join(["+@all" if user.all_commands else "-@all", *user.command_rules])


def flags(user: User) -> list[str]:
    """ACL GETUSER's ``flags``."""
    out = ["on" if user.enabled else "off"]
    if user.all_queues:
        out.append("allkeys")
    if user.nopass:
        out.append("nopass")
    return out
