"""The Authorization header as ``request_user`` reads it, whatever its bytes (a header value
reaches the app decoded as latin-1): what is not credentials is refused (401), never an
error of the app (found by tools/fuzz_http.py: a non-ASCII byte in Basic's credentials made
base64 raise ValueError, answered 500)."""

from __future__ import annotations

import base64

import pytest

from broker.acl_users import Users
from node.http_auth import request_user


def _basic(credentials: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", b"Basic " + credentials)]


@pytest.mark.parametrize("credentials", [
    "ZGVmYXVsdDp4\xe9".encode("latin-1"),  # a non-ASCII byte
    b"\x90\x91",
    b"!!!!",  # not base64
    base64.b64encode(b"default:\xff\xfe"),  # not UTF-8
])
def test_what_is_not_credentials_is_refused(credentials: bytes) -> None:
    users = Users()
    assert request_user(_basic(credentials), users) is None


def test_basic_credentials_still_log_in() -> None:
    users = Users()
    user = request_user(_basic(base64.b64encode(b"default:anything")), users)
    assert user is users.default
