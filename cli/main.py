"""`trisque`: the command line client of a trisque node, in the manner of redis-cli.

Theory of operation
-------------------
Three ways in, one loop: a command given on the command line (run once, or ``-r`` times every
``-i`` seconds), commands read line by line from stdin when it is not a terminal, or an
interactive prompt with readline history. Every command goes over one plain socket to one
node (no cluster hopping: an operator talks to the node they named), and every reply is read
with ``protocol.typed_reply.TypedReplyParser`` so status, bulk and error replies print the way
redis-cli prints them (``cli.reply_format``).

Local tools never share the command namespace with the server: their names are lowercase
words no Disque or Redis command has (``check-log``: a hyphen, which no command name contains;
``worker``), so ``trisque check-log FILE --fix`` can only mean the tool and is never sent to a
node (``trisque WORKER`` is, and is refused as unknown). ``--tool NAME`` is the explicit
spelling.

Exit status: 0 when every reply was a success, 1 when any reply was an error or the node could
not be reached or went away, 2 for a usage error.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from cli import help_table
from cli.reply_format import format_json, format_raw, format_tty
from protocol.resp import NEED_DATA, Error, ProtocolError, encode_command, split_args
from protocol.typed_reply import TypedReplyParser

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7711
CONNECT_TIMEOUT = 5.0

#: Local tools: name -> (module, function taking argv and returning an exit status).
TOOLS = {"check-log": ("cli.check_log", "main"), "worker": ("cli.worker", "main")}

USAGE = f"""\
Usage: trisque [OPTIONS] [command [arg [arg ...]]]
       trisque --tool NAME [tool arguments]

Talk to a trisque node over its Redis-protocol port.

Options:
  -h <hostname>      Node hostname (default: {DEFAULT_HOST}).
  -p <port>          Node port (default: {DEFAULT_PORT}).
  -a <password>      Password sent with AUTH after connecting.
  -r <repeat>        Run the command this many times (-1: until interrupted).
  -i <interval>      Wait this many seconds between repeats (decimals allowed).
  --raw              Raw output: bare values, one array element per line.
  --no-raw           redis-cli style formatted output even when stdout is not a terminal.
  --json             One JSON document per reply (see below).
  --tool NAME ...    Run a local tool instead of sending a command (see below).
  --help             This help.

Output follows redis-cli: formatted ("OK", "\\"text\\"", "(integer) 3", "(nil)",
"(empty array)", "(error) ERR ...", nested "1) 1) ...") when stdout is a terminal, raw
otherwise; --raw / --no-raw / --json choose explicitly. In JSON, bulk strings that are valid
UTF-8 are strings, other bytes are {{"$bytes": "<base64>"}}, errors are {{"error": "..."}},
nil is null.

Without a command: an interactive prompt when stdin is a terminal (history in
~/.trisque_history, or $TRISQUE_HISTFILE; "help", "help COMMAND", "quit", "exit"), otherwise
one command per line is read from stdin (quoting as in redis-cli: "a b", 'x', "\\x00").

Local tools (never sent to a node; also reachable as --tool NAME):
  check-log FILE [--fix]   Check an append-only log file, optionally truncating a torn tail.
  worker --queue Q [options] -- COMMAND [ARGS]
                           Run COMMAND once per job taken from Q (trisque worker --help,
                           docs/worker.md).
The benchmark is a separate program: trisque-benchmark --help.

Exit status: 0 if every reply succeeded, 1 if any reply was an error or the node could not be
reached or closed the connection, 2 for a usage error.

Examples:
  trisque ADDJOB myqueue "hello" 0
  trisque GETJOB TIMEOUT 1000 FROM myqueue
  trisque --json QSTAT myqueue
  trisque -r 5 -i 1 QLEN myqueue
  printf 'QLEN a\\nQLEN b\\n' | trisque
"""


class UsageError(Exception):
    pass


class NodeGone(Exception):
    """The connection broke; ``str()`` is the one-line message for the user."""


@dataclass
class Options:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    password: str | None = None
    output: str = "auto"  # auto | tty | raw | json
    repeat: int = 1
    interval: float = 0.0
    command: list[str] = field(default_factory=list)
    tool: str | None = None
    show_help: bool = False


def parse_argv(argv: list[str]) -> Options:
    """Options come first; the first word that is not an option starts the command, as in
    redis-cli, so a command's own arguments are never read as options."""
    opts = Options()
    i = 0

    def value(name: str) -> str:
        if i + 1 >= len(argv):
            raise UsageError(f"option {name} needs a value")
        return argv[i + 1]

    while i < len(argv):
        arg = argv[i]
        try:
            if arg == "-h":
                opts.host = value(arg)
            elif arg == "-p":
                opts.port = int(value(arg))
                if not 0 < opts.port < 65536:
                    raise UsageError(f"invalid port {opts.port}")
            elif arg == "-a":
                opts.password = value(arg)
            elif arg == "-r":
                opts.repeat = int(value(arg))
            elif arg == "-i":
                opts.interval = float(value(arg))
                if opts.interval < 0:
                    raise UsageError("the interval cannot be negative")
            elif arg in ("--raw", "--no-raw", "--json"):
                opts.output = {"--raw": "raw", "--no-raw": "tty", "--json": "json"}[arg]
                i += 1
                continue
            elif arg in ("--help", "-?"):
                opts.show_help = True
                i += 1
                continue
            elif arg == "--tool":
                opts.tool = value(arg)
                opts.command = argv[i + 2:]
                return opts
            elif arg.startswith("-") and arg != "-":
                raise UsageError(f"unrecognized option '{arg}'")
            else:
                opts.command = argv[i:]
                return opts
        except ValueError:
            raise UsageError(f"invalid value for {arg}: {argv[i + 1]!r}") from None
        i += 2
    return opts


class NodeConnection:
    """One socket to the node, opened lazily and reopened after a break (prompt mode)."""

    def __init__(self, host: str, port: int, password: str | None) -> None:
        self.host, self.port, self.password = host, port, password
        self.sock: socket.socket | None = None
        self.parser = TypedReplyParser()

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"

    def connect(self) -> None:
        """Raises ``NodeGone`` with the redis-cli style message."""
        try:
            self.sock = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT)
        except OSError as exc:
            raise NodeGone(f"Could not connect to trisque at {self.name}: {_reason(exc)}") from None
        # Replies to blocking commands (GETJOB) may take as long as the user asked for.
        self.sock.settimeout(None)
        self.parser = TypedReplyParser()
        if self.password is not None:
            reply = self.call([b"AUTH", self.password.encode()])
            if isinstance(reply, Error):
                sys.stderr.write(f"AUTH failed: {reply}\n")

    def call(self, args: list[bytes]) -> Any:
        if self.sock is None:
            self.connect()
        assert self.sock is not None
        try:
            self.sock.sendall(encode_command(*args))
            while True:
                reply = self.parser.next()
                if reply is not NEED_DATA:
                    return reply
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionResetError("Server closed the connection")
                self.parser.feed(data)
        except (OSError, ProtocolError) as exc:
            self.close()
            raise NodeGone(f"Error: connection to trisque at {self.name} lost: "
                           f"{_reason(exc)}") from None

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


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


def run_prompt(conn: NodeConnection, printer: Printer) -> int:
    try:
        import readline
    except ImportError:  # pragma: no cover - platforms without readline
        readline = None  # type: ignore[assignment]
    histfile = os.environ.get("TRISQUE_HISTFILE") or os.path.expanduser("~/.trisque_history")
    if readline is not None:
        try:
            readline.read_history_file(histfile)
        except OSError:
            pass
        readline.set_history_length(1000)
    try:
        conn.connect()
    except NodeGone as exc:
        sys.stderr.write(f"{exc}\n")
    try:
        while True:
            prompt = f"{conn.name}> " if conn.sock is not None else "not connected> "
            try:
                line = input(prompt)
            except EOFError:
                sys.stdout.write("\n")
                return 0
            except KeyboardInterrupt:
                sys.stdout.write("\n")
                continue
            try:
                args = split_args(line.encode("utf-8", "surrogateescape"))
            except ProtocolError:
                sys.stdout.write("Invalid argument(s)\n")
                continue
            if not args:
                continue
            word = args[0].decode("utf-8", "replace").lower()
            if word in ("quit", "exit"):
                return 0
            if word == "help":
                topic = b" ".join(args[1:]).decode("utf-8", "replace")
                sys.stdout.write(help_table.help_text(topic))
                continue
            if word == "clear":
                sys.stdout.write("\033[H\033[2J")
                continue
            try:
                run_commands(conn, [args], printer)
            except NodeGone as exc:
                sys.stdout.write(f"{exc}\n")
            except KeyboardInterrupt:
                conn.close()  # the reply, if it ever comes, must not answer the next command
                sys.stdout.write("\n")
    finally:
        if readline is not None:
            try:
                readline.write_history_file(histfile)
            except OSError:
                pass
        conn.close()


def run_tool(name: str, argv: list[str]) -> int:
    spec = TOOLS.get(name)
    if spec is None:
        sys.stderr.write(f"trisque: unknown tool '{name}' (tools: {', '.join(TOOLS)})\n")
        return 2
    module_name, func_name = spec
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        sys.stderr.write(f"trisque: the {name} tool is not available in this installation "
                         f"({module_name} is missing)\n")
        return 1
    result = getattr(module, func_name)(argv)
    return int(result or 0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        opts = parse_argv(args)
    except UsageError as exc:
        sys.stderr.write(f"trisque: {exc}\nTry 'trisque --help' for more information.\n")
        return 2
    if opts.show_help:
        sys.stdout.write(USAGE)
        return 0
    if opts.tool is not None:
        return run_tool(opts.tool, opts.command)
    if opts.command and opts.command[0] in TOOLS:
        return run_tool(opts.command[0], opts.command[1:])

    interactive = not opts.command and sys.stdin.isatty()
    mode = opts.output
    if mode == "auto":
        mode = "tty" if (interactive or sys.stdout.isatty()) else "raw"
    printer = Printer(mode, sys.stdout)
    conn = NodeConnection(opts.host, opts.port, opts.password)
    try:
        if interactive:
            return run_prompt(conn, printer)
        conn.connect()
        if opts.command:
            command = [a.encode("utf-8", "surrogateescape") for a in opts.command]
            return run_commands(conn, [command], printer, opts.repeat, opts.interval)
        return run_stdin(conn, sys.stdin.buffer, printer)
    except NodeGone as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head`: stop quietly, like other Unix tools.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep the interpreter from complaining at exit
        except OSError:
            pass
        return 1
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
