"""The RESP codec on literal bytes, no sockets: what clients send in, what the server writes out."""

from __future__ import annotations

import pytest

from protocol.resp import (
    _FAST_WINDOW,
    MAX_BULK_LEN,
    MAX_INLINE_SIZE,
    MAX_MULTIBULK_COUNT,
    NEED_DATA,
    NULL_ARRAY,
    OK,
    Error,
    ProtocolError,
    ReplyReader,
    RequestParser,
    Status,
    encode,
    encode_command,
    encode_into,
    split_args,
)


def drain(parser: RequestParser) -> list[list[bytes]]:
    out = []
    while (cmd := parser.next()) is not NEED_DATA:
        out.append(cmd)
    return out


def parse_all(data: bytes, fast: bool = True) -> list[list[bytes]]:
    parser = RequestParser(fast=fast)
    parser.feed(data)
    return drain(parser)


def parse_error(data: bytes, fast: bool = True) -> str:
    parser = RequestParser(fast=fast)
    parser.feed(data)
    with pytest.raises(ProtocolError) as info:
        drain(parser)
    return str(info.value)


# A pipeline mixing multibulk and inline requests, empty requests Redis skips, an empty
# argument, binary bytes and CRLF inside a bulk, and a quoted inline argument.
PIPELINE = (
    b"*3\r\n$6\r\nADDJOB\r\n$2\r\nq1\r\n$1\r\n0\r\n"
    b"PING\r\n"
    b"*0\r\n"
    b"*-1\r\n"
    b"\r\n"
    b"*2\r\n$4\r\nECHO\r\n$0\r\n\r\n"
    b'ADDJOB q "a b" 0\n'
    b"*2\r\n$4\r\nECHO\r\n$6\r\n\x00\r\n\xff\r\n\r\n"
    b"*1\r\n$4\r\nPING\r\n"
)
PIPELINE_COMMANDS = [
    [b"ADDJOB", b"q1", b"0"],
    [b"PING"],
    [b"ECHO", b""],
    [b"ADDJOB", b"q", b"a b", b"0"],
    [b"ECHO", b"\x00\r\n\xff\r\n"],
    [b"PING"],
]


class TestRequestSplitting:
    def test_whole_buffer(self) -> None:
        assert parse_all(PIPELINE) == PIPELINE_COMMANDS

    def test_byte_by_byte(self) -> None:
        parser = RequestParser()
        got = []
        for i in range(len(PIPELINE)):
            parser.feed(PIPELINE[i : i + 1])
            got += drain(parser)
        assert got == PIPELINE_COMMANDS
        assert parser.buffered == 0

    @pytest.mark.parametrize("cut", range(1, len(PIPELINE)))
    def test_every_split_point(self, cut: int) -> None:
        parser = RequestParser()
        parser.feed(PIPELINE[:cut])
        got = drain(parser)
        parser.feed(PIPELINE[cut:])
        got += drain(parser)
        assert got == PIPELINE_COMMANDS

    def test_short_input_is_not_an_error(self) -> None:
        for partial in (b"*", b"*2", b"*2\r", b"*2\r\n$4", b"*2\r\n$4\r\nPI", b"*2\r\n$4\r\nPING\r\n",
                        b"PIN", b'ADDJOB q "a b'):
            parser = RequestParser()
            parser.feed(partial)
            assert parser.next() is NEED_DATA, partial

    def test_buffered_counts_unconsumed_bytes(self) -> None:
        parser = RequestParser()
        parser.feed(b"PING\r\n*1\r\n$4\r\nPI")
        assert parser.next() == [b"PING"]
        assert parser.next() is NEED_DATA
        parser.feed(b"NG\r\n")
        assert parser.next() == [b"PING"]
        assert parser.buffered == 0

    def test_large_bulk_arrives_in_pieces(self) -> None:
        body = bytes(range(256)) * 4096  # 1 MiB, every byte value
        data = encode_command("ADDJOB", "q", body, "0")
        parser = RequestParser()
        got = []
        for i in range(0, len(data), 65536):
            parser.feed(data[i : i + 65536])
            got += drain(parser)
        assert got == [[b"ADDJOB", b"q", body, b"0"]]

    def test_encode_command_round_trip(self) -> None:
        data = encode_command("ADDJOB", b"q", 0, "TTL", -5, "\u00e9")
        assert data == b"*6\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$1\r\n0\r\n$3\r\nTTL\r\n$2\r\n-5\r\n$2\r\n\xc3\xa9\r\n"
        assert parse_all(data) == [[b"ADDJOB", b"q", b"0", b"TTL", b"-5", "\u00e9".encode()]]


class TestFastPath:
    """What the property test (tests/property/test_resp_fastpath.py) cannot see: that the fast
    path is taken at all, and that ``clear`` forgets what it split ahead."""

    FRAMES = [encode_command("ADDJOB", "q", "body", "0"), encode_command("GETJOB", "FROM", "q"),
              encode_command("ECHO", b"x" * 2000)]

    def test_pipeline_is_split_ahead_and_handed_out_one_by_one(self) -> None:
        parser = RequestParser()
        parser.feed(b"".join(self.FRAMES))
        left = sum(map(len, self.FRAMES))
        for frame, argv in zip(self.FRAMES, ([b"ADDJOB", b"q", b"body", b"0"],
                                              [b"GETJOB", b"FROM", b"q"], [b"ECHO", b"x" * 2000]),
                               strict=True):
            assert parser.next() == argv
            left -= len(frame)
            assert parser.buffered == parser.held == left  # consumed when handed out
        assert parser._ready == []  # the first next() split all three
        assert parser.next() is NEED_DATA

    def test_commands_split_ahead_are_queued(self) -> None:
        parser = RequestParser()
        parser.feed(b"".join(self.FRAMES))
        parser.next()
        assert len(parser._ready) == 2
        slow = RequestParser(fast=False)
        slow.feed(b"".join(self.FRAMES))
        slow.next()
        assert slow._ready == []

    def test_clear_forgets_commands_split_ahead(self) -> None:
        parser = RequestParser()
        parser.feed(b"".join(self.FRAMES))
        assert parser.next() == [b"ADDJOB", b"q", b"body", b"0"]
        parser.clear()
        assert parser.next() is NEED_DATA
        assert parser.buffered == parser.held == 0
        parser.feed(encode_command("PING"))
        assert parser.next() == [b"PING"]
        assert parser.next() is NEED_DATA

    def test_crlf_inside_an_argument_and_a_frame_larger_than_the_window(self) -> None:
        # Both are the full parser's; the commands come back the same all the same.
        body = b"a\r\n$3\r\nb\r\n"
        big = b"y" * (_FAST_WINDOW + 1)
        data = encode_command("ADDJOB", "q", body, "0") + encode_command("ECHO", big)
        assert parse_all(data) == parse_all(data, fast=False) == [[b"ADDJOB", b"q", body, b"0"],
                                                                  [b"ECHO", big]]


class TestInline:
    @pytest.mark.parametrize(
        "line, argv",
        [
            (b"PING\r\n", [b"PING"]),
            (b"PING\n", [b"PING"]),
            (b"  PING   \t\r\n", [b"PING"]),
            (b'ADDJOB q "a b" 0\r\n', [b"ADDJOB", b"q", b"a b", b"0"]),
            (b"ADDJOB q 'a b' 0\r\n", [b"ADDJOB", b"q", b"a b", b"0"]),
            (b'ECHO ""\r\n', [b"ECHO", b""]),
            (b'ECHO "\\x41\\x7a\\n\\r\\t\\b\\a\\"\\\\"\r\n', [b"ECHO", b"Az\n\r\t\b\a\"\\"]),
            (b'ECHO "\\xZZ"\r\n', [b"ECHO", b"xZZ"]),  # not a hex escape: the backslash goes
            (b"ECHO 'it\\'s' 'a\\nb'\r\n", [b"ECHO", b"it's", b"a\\nb"]),  # single quotes: only \'
            # As in sdssplitargs, a quote inside a bare word opens a quoted part of the word.
            (b'ECHO a"b c"\r\n', [b"ECHO", b"ab c"]),
            (b"SET k \xff\xfe\r\n", [b"SET", b"k", b"\xff\xfe"]),
        ],
    )
    def test_split(self, line: bytes, argv: list[bytes]) -> None:
        assert parse_all(line) == [argv]

    @pytest.mark.parametrize(
        "line",
        [b'ECHO "abc\r\n', b"ECHO 'abc\r\n", b'ECHO a"b\r\n', b'ECHO "a"b\r\n', b"ECHO 'a'b\r\n", b'ECHO "\\\r\n'],
    )
    def test_unbalanced_quotes(self, line: bytes) -> None:
        assert parse_error(line) == "Protocol error: unbalanced quotes in request"

    def test_blank_lines_are_skipped(self) -> None:
        assert parse_all(b"\r\n\n   \r\nPING\r\n") == [[b"PING"]]

    def test_split_args_direct(self) -> None:
        assert split_args(b"") == []
        assert split_args(b'a "b c" d') == [b"a", b"b c", b"d"]


# Both ways through the parser: the fast path must leave every limit and its text as it was.
@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "full-parser"])
class TestLimits:
    def test_inline_line_at_the_limit_waits(self, fast: bool) -> None:
        parser = RequestParser(fast=fast)
        parser.feed(b"P" * MAX_INLINE_SIZE)
        assert parser.next() is NEED_DATA

    def test_inline_line_over_the_limit(self, fast: bool) -> None:
        assert MAX_INLINE_SIZE == 64 * 1024
        assert parse_error(b"P" * (MAX_INLINE_SIZE + 1), fast) == "Protocol error: too big inline request"

    def test_inline_over_the_limit_fed_in_pieces(self, fast: bool) -> None:
        parser = RequestParser(fast=fast)
        with pytest.raises(ProtocolError, match="^Protocol error: too big inline request$"):
            for _ in range(20):
                parser.feed(b"x" * 4096)
                assert parser.next() is NEED_DATA

    def test_long_inline_line_with_newline_is_fine(self, fast: bool) -> None:
        # The limit is on what is buffered without a newline, as in Redis.
        arg = b"a" * (MAX_INLINE_SIZE - 10)
        assert parse_all(b"ECHO " + arg + b"\r\n", fast) == [[b"ECHO", arg]]

    @pytest.mark.parametrize(
        "header",
        [b"*99999999999\r\n", b"*%d\r\n" % (MAX_MULTIBULK_COUNT + 1), b"*x\r\n", b"*\r\n",
         b"*1x\r\n", b"*+1\r\n", b"* 1\r\n", b"*1_0\r\n", b"*1.0\r\n", b"*-\r\n", b"*01\r\n",
         b"*-0\r\n"],
    )
    def test_invalid_multibulk_length(self, fast: bool, header: bytes) -> None:
        assert parse_error(header, fast) == "Protocol error: invalid multibulk length"

    def test_largest_multibulk_count_is_accepted(self, fast: bool) -> None:
        assert MAX_MULTIBULK_COUNT == 1024 * 1024
        parser = RequestParser(fast=fast)
        parser.feed(b"*%d\r\n" % MAX_MULTIBULK_COUNT)
        assert parser.next() is NEED_DATA

    def test_multibulk_count_without_newline(self, fast: bool) -> None:
        assert parse_error(b"*" + b"1" * (MAX_INLINE_SIZE + 1), fast) == "Protocol error: too big mbulk count string"

    @pytest.mark.parametrize(
        "bulk",
        [b"$x\r\n", b"$-1\r\n", b"$-5\r\n", b"$\r\n", b"$2147483648\r\n", b"$99999999999999999999999\r\n",
         b"$%d\r\n" % (MAX_BULK_LEN + 1), b"$+3\r\n", b"$ 3\r\n", b"$03\r\nabc\r\n", b"$00\r\n\r\n",
         b"$01024\r\n" + b"x" * 1024 + b"\r\n"],
    )
    def test_invalid_bulk_length(self, fast: bool, bulk: bytes) -> None:
        assert parse_error(b"*1\r\n" + bulk, fast) == "Protocol error: invalid bulk length"

    def test_huge_bulk_refused_before_its_body(self, fast: bool) -> None:
        # Refused on the header alone: nothing of the 2 GB is waited for or buffered.
        parser = RequestParser(fast=fast)
        parser.feed(b"*1\r\n$2147483648\r\n")
        with pytest.raises(ProtocolError, match="^Protocol error: invalid bulk length$"):
            parser.next()

    def test_largest_bulk_is_accepted(self, fast: bool) -> None:
        assert MAX_BULK_LEN == 512 * 1024 * 1024
        parser = RequestParser(fast=fast)
        parser.feed(b"*1\r\n$%d\r\nabc" % MAX_BULK_LEN)
        assert parser.next() is NEED_DATA

    def test_bulk_count_without_newline(self, fast: bool) -> None:
        assert (parse_error(b"*1\r\n$" + b"1" * (MAX_INLINE_SIZE + 1), fast)
                == "Protocol error: too big bulk count string")

    @pytest.mark.parametrize("first", [b"x", b":", b"*", b"+"])
    def test_expected_dollar(self, fast: bool, first: bytes) -> None:
        assert (parse_error(b"*2\r\n$4\r\nECHO\r\n" + first + b"3\r\nabc\r\n", fast)
                == f"Protocol error: expected '$', got '{first.decode()}'")

    def test_error_after_good_commands_keeps_them(self, fast: bool) -> None:
        parser = RequestParser(fast=fast)
        parser.feed(b"PING\r\n*1\r\n$4\r\nPING\r\n*1\r\n$x\r\n")
        assert parser.next() == [b"PING"]
        assert parser.next() == [b"PING"]
        with pytest.raises(ProtocolError):
            parser.next()


class TestEncode:
    @pytest.mark.parametrize(
        "value, resp2, resp3",
        [
            (b"", b"$0\r\n\r\n", b"$0\r\n\r\n"),
            (b"body", b"$4\r\nbody\r\n", b"$4\r\nbody\r\n"),
            (b"a\r\nb\x00", b"$5\r\na\r\nb\x00\r\n", b"$5\r\na\r\nb\x00\r\n"),
            ("h\u00e9", b"$3\r\nh\xc3\xa9\r\n", b"$3\r\nh\xc3\xa9\r\n"),
            (OK, b"+OK\r\n", b"+OK\r\n"),
            (Status("D-12345678-abc-05a1"), b"+D-12345678-abc-05a1\r\n", b"+D-12345678-abc-05a1\r\n"),
            (Error("ERR syntax error"), b"-ERR syntax error\r\n", b"-ERR syntax error\r\n"),
            (0, b":0\r\n", b":0\r\n"),
            (1023, b":1023\r\n", b":1023\r\n"),
            (1024, b":1024\r\n", b":1024\r\n"),
            (-1, b":-1\r\n", b":-1\r\n"),
            (-300, b":-300\r\n", b":-300\r\n"),
            (2**63 - 1, b":9223372036854775807\r\n", b":9223372036854775807\r\n"),
            (-(2**63), b":-9223372036854775808\r\n", b":-9223372036854775808\r\n"),
            (1795315892054000000, b":1795315892054000000\r\n", b":1795315892054000000\r\n"),
            (True, b":1\r\n", b":1\r\n"),
            (False, b":0\r\n", b":0\r\n"),
            (None, b"$-1\r\n", b"_\r\n"),
            (NULL_ARRAY, b"*-1\r\n", b"_\r\n"),
            ([], b"*0\r\n", b"*0\r\n"),
            ((), b"*0\r\n", b"*0\r\n"),
            ([b"q", 1, None], b"*3\r\n$1\r\nq\r\n:1\r\n$-1\r\n", b"*3\r\n$1\r\nq\r\n:1\r\n_\r\n"),
            ([[b"a", []], OK], b"*2\r\n*2\r\n$1\r\na\r\n*0\r\n+OK\r\n",
             b"*2\r\n*2\r\n$1\r\na\r\n*0\r\n+OK\r\n"),
            ({b"len": 3, b"pause": b"none"},
             b"*4\r\n$3\r\nlen\r\n:3\r\n$5\r\npause\r\n$4\r\nnone\r\n",
             b"%2\r\n$3\r\nlen\r\n:3\r\n$5\r\npause\r\n$4\r\nnone\r\n"),
            ({}, b"*0\r\n", b"%0\r\n"),
            ({b"m": {b"k": None}}, b"*2\r\n$1\r\nm\r\n*2\r\n$1\r\nk\r\n$-1\r\n",
             b"%1\r\n$1\r\nm\r\n%1\r\n$1\r\nk\r\n_\r\n"),
            (1.5, b"$3\r\n1.5\r\n", b"$3\r\n1.5\r\n"),
        ],
    )
    def test_value(self, value: object, resp2: bytes, resp3: bytes) -> None:
        assert encode(value) == resp2
        assert encode(value, 2) == resp2
        assert encode(value, 3) == resp3

    def test_long_bulk_and_array_headers(self) -> None:
        assert encode(b"x" * 1024) == b"$1024\r\n" + b"x" * 1024 + b"\r\n"
        assert encode(b"x" * 1023)[:7] == b"$1023\r\n"
        big = [1] * 300
        assert encode(big) == b"*300\r\n" + b":1\r\n" * 300
        assert encode([1] * 255)[:6] == b"*255\r\n"
        assert encode([1] * 256)[:6] == b"*256\r\n"

    def test_encode_into_appends(self) -> None:
        out: list[bytes] = [b"+PONG\r\n"]
        encode_into([b"a"], out)
        encode_into(None, out, 3)
        assert b"".join(out) == b"+PONG\r\n*1\r\n$1\r\na\r\n_\r\n"

    def test_unencodable_type(self) -> None:
        with pytest.raises(TypeError):
            encode(object())
        with pytest.raises(TypeError):
            encode({1, 2})

    def test_error_code(self) -> None:
        assert Error("BADID Invalid Job ID format.").code == "BADID"
        assert Error("NOJOB").code == "NOJOB"


class TestReplyReader:
    def test_round_trip_through_hiredis(self) -> None:
        value = [b"q", Status("D-1"), 7, -7, None, [b"", []], Error("NOJOB Job not known")]
        reader = ReplyReader()
        data = encode(value)
        for i in range(len(data)):
            assert reader.next() is NEED_DATA
            reader.feed(data[i : i + 1])
        got = reader.next()
        # hiredis reads a status as bytes; an error comes back as an Error value.
        assert got[:6] == [b"q", b"D-1", 7, -7, None, [b"", []]]
        assert isinstance(got[6], Error) and got[6] == "NOJOB Job not known"
        assert reader.next() is NEED_DATA

    def test_null_array(self) -> None:
        reader = ReplyReader()
        reader.feed(encode(NULL_ARRAY) + encode(None))
        assert reader.next() is None
        assert reader.next() is None

    def test_malformed_reply(self) -> None:
        reader = ReplyReader()
        reader.feed(b"!oops\r\n")
        with pytest.raises(ProtocolError):
            reader.next()
