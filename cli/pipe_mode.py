"""``trisque --pipe``: mass insertion, as ``redis-cli --pipe`` does it.

stdin goes to the node byte for byte (RESP, or one command per line: the node reads inline
commands with the prompt's quoting), while replies are read as they come, on one non-blocking
socket: nothing waits for a reply before sending more. At the end of stdin an ``ECHO`` of 20
random bytes follows; its reply is the last one, so when it is back every reply is. The
output is redis-cli's: ``All data transferred. Waiting for the last reply...``, ``Last reply
received from server.``, ``errors: N, replies: M``, each error reply on stderr, exit status 1
when there was any error.

Replies are only counted, without a parser while they are one-line replies (status, integer,
error: ADDJOB's job IDs): whole lines are counted with ``bytearray.count`` of their line
breaks, a C loop over what one ``recv`` brought, and error lines, when the count says there
are some, are found and written. From the first reply of another kind on, hiredis's C reader
takes the bytes (``list(iter(gets, NEED_DATA))`` per ``recv``). The closing reply is
recognised by its bytes. Counting 100,000 ADDJOB replies takes about 1.6 ms of CPU, parsing
them with hiredis about 11: the client takes less of the CPU it shares with the node.

A file on stdin goes to the socket with ``sendfile`` (from the page cache, no copy through
this process; a few calls for the whole file); a pipe or a terminal, or a TLS connection, is
read 256 KiB at a time into a buffer made once and sent. Replies are read 256 KiB at a time
into another. Start-up is most of what this mode costs beyond redis-cli: ``cli.main`` imports
this module and ``cli.connection`` (sockets of ``_socket``) and nothing else (hiredis only when
a reply needs it), and ends the process with ``exit_now``.
"""

from __future__ import annotations

import errno
import os
import select
import time

from cli.connection import TYPE_CHECKING, NodeConnection, reason

if TYPE_CHECKING:  # not imported at run time: see cli.connection
    from typing import Any, BinaryIO, TextIO

CHUNK = 256 * 1024
RECV = 256 * 1024
SENDFILE = 4 * 1024 * 1024


class PipeFailed(Exception):
    """The node or stdin failed mid-way; ``str()`` is the message for stderr."""


def run_pipe(conn: NodeConnection, stdin: BinaryIO, out: TextIO, err: TextIO,
             timeout: float) -> int:
    if conn.password is None:
        conn.open_socket()
    else:
        conn.connect()
    sock = conn.sock
    assert sock is not None
    try:
        errors, replies = _transfer(sock, stdin.fileno(), out, err, timeout, conn.name)
    except PipeFailed as exc:
        out.flush()
        err.write(f"{exc}\n")
        return 1
    out.write(f"errors: {errors}, replies: {replies}\n")
    return 1 if errors else 0


#: What the reader's ``gets`` returns while no reply is complete: not its default ``False``,
#: which equals the integer reply 0 and would end ``iter(gets, ...)`` there.
NEED_DATA = object()

ONE_LINE = b"+:-"  # the first bytes of replies of one line: status, integer, error
MINUS = ord("-")


def one_line_replies(buf: bytearray, end: int) -> tuple[int, int] | None:
    """The replies and the errors among them in ``buf[:end]`` if it is whole lines of
    one-line replies (``+`` status, ``:`` integer, ``-`` error: no line break inside), else
    None. ``end`` is just after a line break, and ``buf`` starts at a reply's start."""
    if not end:
        return 0, 0
    if buf[0] not in ONE_LINE:
        return None
    lines = buf.count(b"\n", 0, end)
    width = buf.find(b"\n", 0, end) + 1
    if width * lines == end:
        # Replies of one length (job IDs, +OK, :1): every width-th byte ends a line, and no
        # other does, so each line starts where the one before ends.
        starts = buf[0:end:width]
        errors = starts.count(b"-")
        if (buf[width - 1:end:width].count(b"\n") == lines
                and starts.count(b"+") + starts.count(b":") + errors == lines):
            return lines, errors
    errors = buf.count(b"\n-", 0, end) + (buf[0] == MINUS)
    if buf.count(b"\n+", 0, end) + buf.count(b"\n:", 0, end) + errors + (buf[0] != MINUS) \
            == lines:
        return lines, errors
    return None


class ReplyCounter:
    """Counts the replies read into ``buffer``: whole lines of one-line replies by counting
    their line breaks (C loops over the bytes: the node's ADDJOB replies are all such), each
    error written to ``err``. From the first reply of another kind (a bulk string, an array)
    on, hiredis's reader takes every byte: an array's elements are replies of their own kind.
    ``done`` once the closing ``ECHO magic``'s reply is in (not counted)."""

    def __init__(self, magic: bytes, err: TextIO, size: int = RECV) -> None:
        self.magic = magic
        self.last = b"$%d\r\n%s\r\n" % (len(magic), magic)  # that reply's bytes
        self.err = err
        self.buffer = bytearray(size)  # reused: no large object allocated per read
        self.view = memoryview(self.buffer)
        self.held = 0  # bytes at the buffer's start: the beginning of an unfinished line
        self.reader: Any = None  # hiredis's, once a reply is not a one-line one
        self.error_type: Any = None
        self.replies = self.errors = 0
        self.done = False

    def room(self) -> memoryview:
        return self.view[self.held:]

    def take(self, got: int) -> None:
        """Count what the last read put into ``room()``."""
        buf, size = self.buffer, self.held + got
        self.held = 0
        if self.reader is not None:
            self._parse(0, size)
            return
        ending = buf.endswith(self.last, 0, size)
        end = size - len(self.last) if ending else buf.rfind(b"\n", 0, size) + 1
        counted = one_line_replies(buf, end)
        rest = size - end
        if counted is None or not (ending or rest < len(buf) // 2):
            # Not all one-line replies, or one longer than half the buffer.
            self._parse(0, size)
            return
        self.replies += counted[0]
        if counted[1]:
            self._errors(end)
        if ending:
            self.done = True
        else:
            buf[:rest] = buf[end:size]  # the unfinished line, completed by the next read
            self.held = rest

    def _errors(self, end: int) -> None:
        """Write the error replies among the one-line replies of ``buffer[:end]``."""
        buf = self.buffer
        at = -1 if buf[0] == MINUS else buf.find(b"\n-", 0, end)  # the break before one
        while True:
            stop = buf.find(b"\n", at + 1, end)
            self.err.write(buf[at + 2:stop - 1].decode(errors="replace") + "\n")
            self.errors += 1
            at = buf.find(b"\n-", stop, end)
            if at < 0:
                return

    def _parse(self, start: int, end: int) -> None:
        if self.reader is None:
            import hiredis

            self.reader = hiredis.Reader(notEnoughData=NEED_DATA)
            self.error_type = hiredis.ReplyError
        self.reader.feed(self.buffer, start, end - start)  # copied into the reader's buffer
        batch = list(iter(self.reader.gets, NEED_DATA))
        error_type = self.error_type
        if error_type in map(type, batch):
            for reply in batch:
                if type(reply) is error_type:
                    self.err.write(f"{reply}\n")
                    self.errors += 1
        self.replies += len(batch)
        if batch and batch[-1] == self.magic:  # the closing ECHO's: the last reply
            self.replies -= 1
            self.done = True


def _transfer(sock: Any, stdin_fd: int, out: TextIO, err: TextIO, timeout: float,
              name: str) -> tuple[int, int]:
    """``sock`` is a ``_socket.socket``, or an ``ssl.SSLSocket`` with --tls."""
    # Hex: the closing reply is then a plain 20-byte bulk string, with no line break inside.
    magic = os.urandom(10).hex().encode()
    # The leading CRLF is an empty inline command (skipped): if stdin ended mid-line, the
    # ECHO still starts a command of its own.
    final = b"\r\n*2\r\n$4\r\nECHO\r\n$20\r\n" + magic + b"\r\n"
    counter = ReplyCounter(magic, err)
    sock.setblocking(False)
    # TLS: "would block" is SSLWantReadError / SSLWantWriteError, and a record may already be
    # decrypted inside the TLS object, where poll does not see it.
    would_block: tuple[type[BaseException], ...] = (BlockingIOError,)
    tls_pending = getattr(sock, "pending", None)
    if tls_pending is not None:
        import ssl

        would_block = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
    poller = select.poll()
    fd = sock.fileno()
    # A file on stdin goes from the page cache to the socket with sendfile (no copy through
    # this process); a pipe or a terminal, and TLS, are read into ``chunk`` and sent.
    sendfile = tls_pending is None
    chunk = bytearray(CHUNK)
    pending = memoryview(chunk)[:0]  # read from stdin, not yet sent
    sent = 0
    eof = False
    last_read = time.monotonic()
    while not counter.done:
        want_write = not eof or sent < len(pending)
        poller.register(fd, select.POLLIN | (select.POLLOUT if want_write else 0))
        buffered = tls_pending is not None and tls_pending() > 0
        events = poller.poll(0 if buffered else 1000)
        mask = events[0][1] if events else 0
        if buffered:
            mask |= select.POLLIN
        if mask & (select.POLLIN | select.POLLHUP | select.POLLERR):
            try:
                got: int | None = sock.recv_into(counter.room())
            except would_block:
                got = None
            except OSError as exc:
                raise PipeFailed(f"Error reading replies from server: {reason(exc)}") from None
            if got is not None:
                if got:
                    last_read = time.monotonic()
                    counter.take(got)
                elif not counter.done:
                    raise PipeFailed(f"Error: connection to trisque at {name} lost: "
                                     "Server closed the connection")
        if mask & select.POLLOUT and not counter.done:
            if sent == len(pending) and not eof:
                if sendfile:
                    try:
                        if os.sendfile(fd, stdin_fd, None, SENDFILE):
                            continue
                    except BlockingIOError:
                        continue
                    except OSError as exc:
                        if exc.errno != errno.EINVAL:  # EINVAL: stdin is not a file
                            raise PipeFailed("Error writing to the server: "
                                             f"{reason(exc)}") from None
                        sendfile = False
                if not sendfile:
                    pending, sent = memoryview(chunk)[:os.readv(stdin_fd, [chunk])], 0
                if sendfile or not pending:
                    eof = True
                    pending = memoryview(final)
                    out.write("All data transferred. Waiting for the last reply...\n")
                    out.flush()
            try:
                sent += sock.send(pending[sent:])
            except would_block:
                pass
            except OSError as exc:
                raise PipeFailed(f"Error writing to the server: {reason(exc)}") from None
        if eof and timeout > 0 and time.monotonic() - last_read > timeout and not counter.done:
            err.write(f"No replies for {timeout:g} seconds: exiting.\n")
            counter.errors += 1
            break
    if counter.done:
        out.write("Last reply received from server.\n")
    return counter.errors, counter.replies
