"""`trisque`: the command line client of a trisque node, in the manner of redis-cli.

Theory of operation
-------------------
Three ways in, one loop (``cli.command_loop``): a command given on the command line (run once,
or ``-r`` times every ``-i`` seconds; ``-x``/``-X`` read an argument from stdin), commands read
line by line from stdin when it is not a terminal, or the interactive prompt (``cli.prompt``:
completion, hints, history). Every command goes over one plain socket to one node
(``cli.connection``; no cluster hopping: an operator talks to the node they named), and every
reply prints the way redis-cli prints it (``cli.reply_format``). The modes that replace that
loop have modules of their own: ``--pipe`` (``cli.pipe_mode``), ``--stat``, ``--latency`` and
``--latency-history`` (``cli.watch_modes``). Options and the help text are in
``cli.options``. This module only dispatches, and imports each part when it is used: Python's
start-up is the largest fixed cost of a short run.

Local tools never share the command namespace with the server: their names are lowercase
words no Disque or Redis command has (``check-log``: a hyphen, which no command name contains;
``worker``), so ``trisque check-log FILE --fix`` can only mean the tool and is never sent to a
node (``trisque WORKER`` is, and is refused as unknown). ``--tool NAME`` is the explicit
spelling.

Exit status: 0 when every reply was a success, 1 when any reply was an error or the node could
not be reached or went away, 2 for a usage error.
"""

from __future__ import annotations

import os
import sys

from cli.connection import NodeConnection, NodeGone, reason
from cli.options import TOOLS, USAGE, Options, UsageError, parse_argv


def run_tool(name: str, argv: list[str]) -> int:
    spec = TOOLS.get(name)
    if spec is None:
        sys.stderr.write(f"trisque: unknown tool '{name}' (tools: {', '.join(TOOLS)})\n")
        return 2
    module_name, func_name = spec
    import importlib

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


def run_mode(conn: NodeConnection, opts: Options, output: str) -> int:
    if opts.mode == "pipe":
        from cli.pipe_mode import run_pipe

        return run_pipe(conn, sys.stdin.buffer, sys.stdout, sys.stderr, opts.pipe_timeout)
    from cli import watch_modes

    if opts.mode == "stat":
        return watch_modes.run_stat(conn, opts.interval, sys.stdout)
    return watch_modes.run_latency(conn, opts.mode == "latency-history", opts.interval,
                                   output, sys.stdout)


def exit_now(status: int) -> None:
    """End the process without the interpreter's teardown (freeing every module and object:
    about 2 ms, a fifth of ``--pipe``'s start-up): nothing is left to do once the output is
    flushed, the kernel closes the socket."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str] | None = None) -> int:
    """The ``trisque`` command; ``argv`` None means run as the program (``sys.argv``), which
    ``--pipe`` then leaves with ``exit_now``."""
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

    interactive = not opts.command and opts.mode is None and sys.stdin.isatty()
    output = opts.output
    if output == "auto":
        output = "tty" if (interactive or sys.stdout.isatty()) else "raw"
    try:
        tls = opts.tls_options()
    except OSError as exc:  # a certificate or key file that cannot be read
        sys.stderr.write(f"Could not create an SSL context: {reason(exc)}\n")
        return 1
    conn = NodeConnection(opts.host, opts.port, opts.password, opts.user, tls)
    try:
        if opts.mode is not None:
            status = run_mode(conn, opts, output)
            if opts.mode == "pipe" and argv is None:
                exit_now(status)
            return status
        # Imported here, not above: --pipe runs without the reply formatters (start-up time).
        from cli.command_loop import Printer, command_from, run_commands, run_stdin

        printer = Printer(output, sys.stdout)
        if interactive:
            from cli.prompt import run_prompt

            def send(command: list[bytes]) -> None:
                run_commands(conn, [command], printer)

            return run_prompt(conn, send)
        conn.connect()
        if opts.command:
            return run_commands(conn, [command_from(opts)], printer, opts.repeat,
                                opts.interval or 0.0)
        return run_stdin(conn, sys.stdin.buffer, printer)
    except NodeGone as exc:
        sys.stdout.flush()
        sys.stderr.write(f"{exc}\n")
        return 1
    except KeyboardInterrupt:
        if opts.mode is not None and output == "tty":
            sys.stdout.write("\n")  # end the line a latency mode redraws
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
