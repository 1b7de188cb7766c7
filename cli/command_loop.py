"""The command loop of `trisque`: commands sent one at a time, each reply printed the way
redis-cli prints it (``cli.reply_format``), for a command given on the command line (``-r``
times every ``-i`` seconds; ``-x``/``-X`` read an argument from stdin), for commands read line by
line from stdin, and for the prompt (``cli.prompt``)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from cli.connection import NodeConnection
from cli.options import TOOLS, Options
from cli.reply_format import format_json, format_raw, format_tty
from protocol.resp import Error, ProtocolError, split_args


class Printer:
    def __init__(self, mode: str, out: TextIO) -> None:
        self.mode = mode
        self.out = out

    def reply(self, reply: Any) -> None:
        if self.mode == "raw":
            data = format_raw(reply)
        elif self.mode == "json":
            data = format_json(reply).encode("utf-8", "surrogateescape")
        else:
            data = format_tty(reply).encode("utf-8", "surrogateescape")
        self.out.flush()
        self.out.buffer.write(data)
        self.out.buffer.flush()


def _hint_for_tool(args: list[bytes], reply: Any) -> None:
    if isinstance(reply, Error) and args and args[0].decode("utf-8", "replace").lower() in TOOLS:
        name = args[0].decode().lower()
        sys.stderr.write(f"hint: local tools are run as: trisque --tool {name} ...\n")


def run_commands(conn: NodeConnection, commands: list[list[bytes]], printer: Printer,
                 repeat: int = 1, interval: float = 0.0) -> int:
    """Send each command (``repeat`` times), print each reply; 1 if any reply was an error."""
    status = 0
    n = 0
    while repeat < 0 or n < repeat:
        if n and interval:
            time.sleep(interval)
        n += 1
        for args in commands:
            reply = conn.call(args)
            printer.reply(reply)
            if isinstance(reply, Error):
                status = 1
                _hint_for_tool(args, reply)
    return status


def run_stdin(conn: NodeConnection, stream: Any, printer: Printer) -> int:
    status = 0
    for raw_line in stream:
        line = raw_line.rstrip(b"\r\n")
        try:
            args = split_args(line)
        except ProtocolError:
            sys.stderr.write("Invalid argument(s)\n")
            status = 1
            continue
        if args:
            status |= run_commands(conn, [args], printer)
    return status


def command_from(opts: Options) -> list[bytes]:
    """The command line's command, with the argument -x or -X reads from stdin."""
    command = [a.encode("utf-8", "surrogateescape") for a in opts.command]
    if opts.stdin_last_arg:
        command.append(sys.stdin.buffer.read())
    elif opts.stdin_tag is not None:
        command[opts.command.index(opts.stdin_tag)] = sys.stdin.buffer.read()
    return command
