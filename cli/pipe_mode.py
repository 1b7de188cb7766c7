"""``trisque --pipe``: mass insertion, as ``redis-cli --pipe`` does it.

stdin goes to the node byte for byte (RESP, or one command per line: the node reads inline
commands with the prompt's quoting), while replies are read as they come, on one non-blocking
socket: nothing waits for a reply before sending more. At the end of stdin an ``ECHO`` of 20
random bytes follows; its reply is the last one, so when it is back every reply is. The
output is redis-cli's: ``All data transferred. Waiting for the last reply...``, ``Last reply
received from server.``, ``errors: N, replies: M``, each error reply on stderr, exit status 1
when there was any error.

Replies are only counted, so hiredis's C reader parses them (the Python reply parser would
cost more than the node's work per command), all that one ``recv`` brought in one C-level call
(``list(iter(gets, NEED_DATA))``), with no Python code per reply unless the batch holds an error.
Reads from stdin and from the socket are 256 KiB at a time, into two buffers made once, so few
system calls keep the node's input full and its replies drained. hiredis is imported after the
first chunk is sent, while the node works on it. Start-up is most of what this mode costs beyond
redis-cli: ``cli.main`` imports this module and ``cli.connection`` (sockets of ``_socket``) and
nothing else, and ends the process with ``exit_now``.
"""

from __future__ import annotations

import os
import select
import time

from cli.connection import TYPE_CHECKING, NodeConnection, reason

if TYPE_CHECKING:  # not imported at run time: see cli.connection
    from typing import Any, BinaryIO, TextIO

CHUNK = 256 * 1024
RECV = 256 * 1024


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


def _reader() -> tuple[Any, Any]:
    """hiredis's reader and the type of its error replies."""
    import hiredis

    return hiredis.Reader(notEnoughData=NEED_DATA), hiredis.ReplyError


def _transfer(sock: Any, stdin_fd: int, out: TextIO, err: TextIO, timeout: float,
              name: str) -> tuple[int, int]:
    """``sock`` is a ``_socket.socket``, or an ``ssl.SSLSocket`` with --tls."""
    magic = os.urandom(20)
    # The leading CRLF is an empty inline command (skipped): if stdin ended mid-line, the
    # ECHO still starts a command of its own.
    final = b"\r\n*2\r\n$4\r\nECHO\r\n$20\r\n" + magic + b"\r\n"
    reader: Any = None  # a hiredis.Reader once the first chunk is on its way
    error_type: Any = None
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
    # Reused buffers, so no 256 KiB object is allocated (and its pages faulted in) per read.
    chunk = bytearray(CHUNK)
    replies_in = bytearray(RECV)
    pending = memoryview(chunk)[:0]  # read from stdin, not yet sent
    sent = 0
    eof = done = False
    errors = replies = 0
    last_read = time.monotonic()
    while not done:
        want_write = not eof or sent < len(pending)
        poller.register(fd, select.POLLIN | (select.POLLOUT if want_write else 0))
        buffered = tls_pending is not None and tls_pending() > 0
        events = poller.poll(0 if buffered else 1000)
        mask = events[0][1] if events else 0
        if buffered:
            mask |= select.POLLIN
        if mask & (select.POLLIN | select.POLLHUP | select.POLLERR):
            try:
                got: int | None = sock.recv_into(replies_in)
            except would_block:
                got = None
            except OSError as exc:
                raise PipeFailed(f"Error reading replies from server: {reason(exc)}") from None
            if got is not None:
                if got:
                    last_read = time.monotonic()
                    if reader is None:  # a reply before anything was sent: an error, surely
                        reader, error_type = _reader()
                    reader.feed(replies_in, 0, got)  # copied into the reader's own buffer
                    batch = list(iter(reader.gets, NEED_DATA))
                    if error_type in map(type, batch):
                        for reply in batch:
                            if type(reply) is error_type:
                                err.write(f"{reply}\n")
                                errors += 1
                    replies += len(batch)
                    if eof and batch and batch[-1] == magic:  # the ECHO's: the last reply
                        out.write("Last reply received from server.\n")
                        replies -= 1
                        done = True
                if not got and not done:
                    raise PipeFailed(f"Error: connection to trisque at {name} lost: "
                                     "Server closed the connection")
        if mask & select.POLLOUT and not done:
            if sent == len(pending) and not eof:
                pending, sent = memoryview(chunk)[:os.readv(stdin_fd, [chunk])], 0
                if not pending:
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
            if reader is None:
                reader, error_type = _reader()
        if eof and timeout > 0 and time.monotonic() - last_read > timeout and not done:
            err.write(f"No replies for {timeout:g} seconds: exiting.\n")
            errors += 1
            break
    return errors, replies
