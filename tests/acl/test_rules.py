"""The ACL rule parser (broker/acl.py): Redis's rules, its errors, fuzzed with hypothesis."""

from __future__ import annotations

import hashlib

import hypothesis.strategies as st
from hypothesis import given, settings

from broker import acl, command_table
from broker.acl import CATALOG, User, apply, apply_all, describe

_WORDS = ["on", "off", "nopass", "resetpass", "allkeys", "resetkeys", "reset", "allcommands",
          "nocommands", "+@all", "-@all", "resetchannels", "allchannels", "~*"]
_COMMANDS = sorted(CATALOG.subs) + ["config|get", "cluster|meet", "client|setname", "nosuch"]
_RULES = st.one_of(
    st.sampled_from(_WORDS),
    st.builds(lambda s, c: s + c, st.sampled_from("+-"), st.sampled_from(_COMMANDS)),
    st.builds(lambda s, c: s + "@" + c, st.sampled_from("+-"),
              st.sampled_from([*acl.CATEGORIES, "bogus"])),
    st.builds(lambda p: "~" + p, st.text(st.sampled_from("ab*?[]^\\-"), max_size=6)),
    st.builds(lambda p: ">" + p, st.text(max_size=8)),
    st.builds(lambda p: "<" + p, st.text(max_size=8)),
    st.builds(lambda h: "#" + h, st.text(st.sampled_from("0123456789abcdefABCDEF"),
                                          min_size=62, max_size=65)),
    st.text(max_size=10),
)


def _state(u: User) -> tuple[object, ...]:
    return (u.enabled, u.nopass, u.passwords, sorted(u.allowed), sorted(u.allowed_subs),
            sorted(u.denied_subs), u.patterns, u.all_queues, u.restricted)


@settings(max_examples=400, deadline=None)
@given(st.lists(_RULES, max_size=12))
def test_any_rules_give_an_error_text_or_a_user_that_round_trips(rules: list[str]) -> None:
    user = acl.new_user("u")
    for rule in rules:
        error = apply(user, rule)  # never raises: an error text or None
        assert error is None or isinstance(error, str)
    again = acl.new_user("u")
    assert apply_all(again, describe(user)) is None
    assert _state(again) == _state(user)


@settings(max_examples=200, deadline=None)
@given(st.lists(_RULES, max_size=8), st.sampled_from(_COMMANDS[:-1]),
       st.text(st.sampled_from("abq*:"), max_size=5).map(str.encode))
def test_checks_agree_after_the_round_trip(rules: list[str], command: str, queue: bytes) -> None:
    user = acl.new_user("u")
    for rule in rules:
        apply(user, rule)
    again = acl.new_user("u")
    apply_all(again, describe(user))
    name, _, sub = command.partition("|")
    assert user.may_run(name, sub) == again.may_run(name, sub)
    assert user.may_use(queue) == again.may_use(queue)


def test_redis_rules_and_errors() -> None:
    u = acl.new_user("alice")
    assert u.restricted and not u.enabled
    assert apply_all(u, ["on", ">s3cret", "~jobs:*", "+@jobs", "-ackjob", "+qlen"]) is None
    assert u.passwords == [hashlib.sha256(b"s3cret").hexdigest()]
    assert u.password_ok(b"s3cret") and not u.password_ok(b"nope")
    assert u.may_run("addjob", "") and u.may_run("qlen", "") and not u.may_run("ackjob", "")
    assert not u.may_run("config", "get")
    assert u.may_use(b"jobs:1") and not u.may_use(b"other")
    assert apply(u, "<nope") == acl.NO_SUCH_PASSWORD
    assert apply(u, "#ABC") == acl.BAD_HASH
    assert apply(u, "+nosuch") == acl.UNKNOWN_COMMAND
    assert apply(u, "+@nosuch") == acl.UNKNOWN_COMMAND
    assert apply(u, "bogus") == acl.SYNTAX
    assert apply(u, "allkeys") is None and apply(u, "~x") == acl.PATTERN_AFTER_ALL
    assert apply(u, "+config|get") is None and u.may_run("config", "get")
    assert not u.may_run("config", "set")
    assert apply(u, "+config") is None and apply(u, "-config|set") is None
    assert u.may_run("config", "get") and not u.may_run("config", "set")
    assert apply(u, "reset") is None
    assert not u.enabled and not u.passwords and not u.patterns and not u.allowed


def test_every_row_declares_known_categories_and_admin_commands_are_admin() -> None:
    for row in command_table.ROWS:
        assert CATALOG.categories[row.name.decode()], row
    for cid in ("debug", "config", "shutdown", "cluster|meet", "cluster|forget",
                "cluster|reset", "bgrewriteaof", "monitor", "client|kill", "acl"):
        assert {"admin", "dangerous"} <= CATALOG.categories[cid], cid
    assert "admin" not in CATALOG.categories["cluster"]
    assert CATALOG.categories["addjob"] == {"write", "jobs", "fast"}


def test_the_default_user_is_not_restricted_until_narrowed() -> None:
    d = acl.default_user()
    assert not d.restricted
    apply(d, "-debug")
    assert d.restricted
    apply(d, "+debug")
    assert not d.restricted


def test_glob_patterns_follow_redis() -> None:
    for pattern, yes, no in [(b"q*", b"qa", b"aq"), (b"q?", b"q1", b"q12"),
                             (b"[ab]x", b"bx", b"cx"), (b"[^ab]x", b"cx", b"ax"),
                             (b"\\*", b"*", b"a"), (b"[a-c]", b"b", b"d")]:
        r = acl.glob_regex(pattern)
        assert r.fullmatch(yes) and not r.fullmatch(no), pattern
