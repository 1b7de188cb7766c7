"""How `trisque --pipe` counts replies (cli/pipe_mode.py): lines of one-line replies by their
line breaks, anything from the first other reply on with hiredis, and the same counts and
errors whichever way the node's replies are cut into reads."""

from __future__ import annotations

import io
import random

import hiredis
import pytest

from cli.pipe_mode import ReplyCounter, one_line_replies

MAGIC = b"0123456789abcdef0123"
LAST = b"$20\r\n" + MAGIC + b"\r\n"
JOB_ID = b"+D-96dd72ac-d8kwwl44ReE5qbqfLaezTvBA-05a1\r\n"


@pytest.mark.parametrize(("data", "counted"), [
    (b"", (0, 0)),
    (JOB_ID * 3, (3, 0)),
    (b"+OK\r\n:1\r\n-E\r\n+OK\r\n", (4, 1)),  # one length, every kind
    (b"+OK\r\n:12\r\n+PONG\r\n:0\r\n", (4, 0)),  # lengths that differ
    (b"+OK\r\n-ERR no\r\n+OK\r\n", (3, 1)),
    (b"-ERR no\r\n-ERR no\r\n:1\r\n", (3, 2)),
    (b"$3\r\nabc\r\n", None),
    (b"+OK\r\n$2\r\n+A\r\n", None),  # a bulk string whose body reads as a status line
    (b"+OK\r\n$5\r\n:1\r\n+\r\n", None),
    (b"*1\r\n+OK\r\n", None),
    (b"+OK\r\n+OK\r\n*0\r\n", None),  # one length, but an array among them
])
def test_one_line_replies_are_counted_and_anything_else_refused(
        data: bytes, counted: tuple[int, int] | None) -> None:
    assert one_line_replies(bytearray(data) + b"+tail", len(data)) == counted


def stream() -> tuple[bytes, int, list[bytes]]:
    """Replies of every kind, the closing ECHO's last: the bytes, the replies before that
    one and the error messages."""
    parts = [JOB_ID * 300, b"-ERR unknown command 'X'\r\n", b":0\r\n" * 50, b"-E\r\n",
             b":10\r\n:9\r\n" * 40, b"$5\r\nab\r\nc\r\n", b"*2\r\n+a\r\n$-1\r\n",
             JOB_ID * 200, b"+OK\r\n:7\r\n", b"-NOJOB none\r\n", b"$0\r\n\r\n"]
    counts = [300, 1, 50, 1, 80, 1, 1, 200, 2, 1, 1]
    return b"".join(parts) + LAST, sum(counts), [b"ERR unknown command 'X'", b"E",
                                                 b"NOJOB none"]


def feed(counter: ReplyCounter, data: bytes, cuts: list[int]) -> None:
    at = 0
    for cut in cuts + [len(data)]:
        while at < cut:
            room = counter.room()
            n = min(cut - at, len(room))
            room[:n] = data[at:at + n]
            counter.take(n)
            at += n


@pytest.mark.parametrize("seed", range(40))
def test_counts_and_errors_do_not_depend_on_how_the_replies_are_read(seed: int) -> None:
    data, replies, errors = stream()
    rng = random.Random(seed)
    if seed == 0:
        cuts = list(range(1, len(data)))  # a byte at a time
    else:
        cuts = sorted(rng.sample(range(1, len(data)), rng.choice([1, 3, 20, 300])))
    err = io.StringIO()
    counter = ReplyCounter(MAGIC, err, size=rng.choice([64, 4096, 256 * 1024]))
    feed(counter, data, cuts)
    assert (counter.replies, counter.errors, counter.done) == (replies, len(errors), True)
    assert err.getvalue() == "".join(f"{e.decode()}\n" for e in errors)


def test_one_line_replies_alone_need_no_parser() -> None:
    err = io.StringIO()
    counter = ReplyCounter(MAGIC, err)
    feed(counter, JOB_ID * 5000 + b":1\r\n-ERR a\r\n" * 10 + LAST, [1000, 60_001, 150_000])
    assert (counter.replies, counter.errors, counter.done, counter.reader) == \
        (5020, 10, True, None)
    assert err.getvalue() == "ERR a\n" * 10


def test_a_one_line_reply_longer_than_half_the_buffer_goes_to_the_parser() -> None:
    long = b"+" + b"x" * 300 + b"\r\n"
    counter = ReplyCounter(MAGIC, io.StringIO(), size=256)
    feed(counter, JOB_ID * 3 + long + JOB_ID + LAST, [])
    assert (counter.replies, counter.done) == (5, True)
    assert isinstance(counter.reader, hiredis.Reader)


def test_not_done_before_the_closing_reply() -> None:
    counter = ReplyCounter(MAGIC, io.StringIO())
    feed(counter, JOB_ID * 10 + LAST[:-1], [])
    assert (counter.replies, counter.done) == (10, False)
    feed(counter, LAST[-1:], [])
    assert (counter.replies, counter.done) == (10, True)
