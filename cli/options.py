"""`trisque`'s command line: its options, its help text, and the node URI of ``-u``."""

from __future__ import annotations

# For type checkers only: importing typing costs every run's start-up (see cli.connection).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from client.tls import TlsOptions

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7711

USAGE = f"""\
Usage: trisque [OPTIONS] [command [arg [arg ...]]]
       trisque --tool NAME [tool arguments]

Talk to a trisque node over its Redis-protocol port.

Options:
  -h <hostname>      Node hostname (default: {DEFAULT_HOST}).
  -p <port>          Node port (default: {DEFAULT_PORT}).
  -a <password>      Password sent with AUTH after connecting.
  -u <uri>           Node URI: trisque://[user:password@]host[:port] (redis:// also works;
                     rediss:// or trisques:// turn on --tls); its password, host and port
                     replace -a, -h and -p.
  -r <repeat>        Run the command this many times (-1: until interrupted).
  -i <interval>      Wait this many seconds between repeats (decimals allowed); with --stat
                     the seconds between lines (default 1), with --latency-history the
                     seconds each line covers (default 15).
  -x                 Read the last argument from stdin (all of it, bytes as they are).
  -X <tag>           Read the argument equal to <tag> from stdin instead (ADDJOB's body
                     is not its last argument: trisque -X @ ADDJOB q @ 0 < body.json).
  --raw              Raw output: bare values, one array element per line.
  --no-raw           redis-cli style formatted output even when stdout is not a terminal.
  --json             One JSON document per reply (see below).
  --pipe             Mass insertion: send stdin to the node as it is (RESP, or one command
                     per line as at the prompt), pipelined, and print a summary:
                     "errors: N, replies: M". Every error reply goes to stderr; exit 1 if
                     any.
  --pipe-timeout <n> With --pipe: give up after n seconds without a reply once stdin is
                     sent (default 30, 0: wait forever).
  --stat             A line a second of the node's figures: jobs held, queued and active,
                     ops/s, clients, blocked clients, memory, queues; headers every 20 lines.
  --latency          PING the node every 10 ms and show min, max and average round trip
                     in ms; not on a terminal: one line after -i seconds (default 1), then
                     exit.
  --latency-history  As --latency, starting a new line every -i seconds (default 15).
  --tls              Connect over TLS (the node's tls-port), in every mode. As redis-cli,
                     the node's certificate chain is checked, not its name.
  --sni <host>       Server name indication for TLS.
  --cacert <file>    CA certificate file to verify the node with.
  --cacertdir <dir>  Directory of trusted CA certificates (named by hash). Without
                     --cacert or --cacertdir, the system's trusted CAs.
  --insecure         Skip the node's certificate check (the link is still encrypted).
  --cert <file>      Client certificate to authenticate with (tls-auth-clients yes).
  --key <file>       Its private key.
  --tls-ciphers <list>
                     OpenSSL cipher list for TLSv1.2 and below.
  --tool NAME ...    Run a local tool instead of sending a command (see below).
  --help             This help.

Output follows redis-cli: formatted ("OK", "\\"text\\"", "(integer) 3", "(nil)",
"(empty array)", "(error) ERR ...", nested "1) 1) ...") when stdout is a terminal, raw
otherwise; --raw / --no-raw / --json choose explicitly. In JSON, bulk strings that are valid
UTF-8 are strings, other bytes are {{"$bytes": "<base64>"}}, errors are {{"error": "..."}},
nil is null.

Without a command: an interactive prompt when stdin is a terminal, otherwise one command per
line is read from stdin (quoting as in redis-cli: "a b", 'x', "\\x00"). At the prompt: Tab
completes command names, subcommands, keywords and queue names (from QSCAN); the rest of a
command's syntax shows in grey as you type; history in ~/.trisque_history (or
$TRISQUE_HISTFILE); "help", "help COMMAND", "quit", "exit", "clear".

Local tools (never sent to a node; also reachable as --tool NAME):
  check-log FILE [--fix]   Check an append-only log file, optionally truncating a torn tail.
  worker --queue Q [options] -- COMMAND [ARGS]
                           Run COMMAND once per job taken from Q (trisque worker --help,
                           docs/worker.md).
  certs DIR [--nodes N] [--days D]
                           Make a CA, node and client certificates for a TLS test cluster.
The benchmark is a separate program: trisque-benchmark --help.

Exit status: 0 if every reply succeeded, 1 if any reply was an error or the node could not be
reached or closed the connection, 2 for a usage error.

Examples:
  trisque ADDJOB myqueue "hello" 0
  trisque GETJOB TIMEOUT 1000 FROM myqueue
  trisque --json QSTAT myqueue
  trisque -r 5 -i 1 QLEN myqueue
  trisque -u trisque://:secret@10.0.0.5:7711 HELLO
  trisque -X @ ADDJOB myqueue @ 0 < body.json
  trisque -x PING < message.txt
  printf 'QLEN a\\nQLEN b\\n' | trisque
  trisque --pipe < commands.txt
  trisque --stat
  trisque --latency-history -i 5
"""


#: Local tools: name -> (module, function taking argv and returning an exit status).
TOOLS = {"check-log": ("cli.check_log", "main"), "worker": ("cli.worker", "main"),
         "certs": ("cli.certs", "main")}


class UsageError(Exception):
    pass


#: TLS options that take a value (``--cacert FILE``...).
TLS_VALUES = ("sni", "cacert", "cacertdir", "cert", "key", "tls-ciphers")

#: Modes that replace the command loop (at most one per run).
MODES = ("pipe", "stat", "latency", "latency-history")


class Options:
    """What the command line asked for. A plain class: this module is imported on every run,
    and the dataclasses module would add to the start-up (see cli.connection)."""

    def __init__(self) -> None:
        self.host = DEFAULT_HOST
        self.port = DEFAULT_PORT
        self.user: str | None = None
        self.password: str | None = None
        self.output = "auto"  # auto | tty | raw | json
        self.repeat = 1
        self.interval: float | None = None  # None: the mode's default
        self.stdin_last_arg = False
        self.stdin_tag: str | None = None  # -X: the argument to replace with stdin
        self.mode: str | None = None  # one of MODES
        self.pipe_timeout = 30.0
        self.command: list[str] = []
        self.tool: str | None = None
        self.show_help = False
        # TLS (redis-cli's options): any file option or --insecure alone does not turn it on.
        self.tls = False
        self.tls_files: dict[str, str] = {}  # sni cacert cacertdir cert key tls-ciphers
        self.insecure = False

    def tls_options(self) -> TlsOptions | None:
        """The ``client.tls.TlsOptions`` asked for, or None without --tls."""
        if not self.tls:
            return None
        from client.tls import TlsOptions

        files = self.tls_files
        return TlsOptions(files.get("cacert"), files.get("cacertdir"), files.get("cert"),
                          files.get("key"), self.insecure, files.get("sni"),
                          files.get("tls-ciphers"), check_hostname=False)


def parse_uri(uri: str, opts: Options) -> None:
    """``trisque://[[user]:password@]host[:port]`` (or ``redis://``, as redis-cli users type
    it); what the URI names replaces the defaults and earlier -h/-p/-a."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in ("trisque", "redis", "trisques", "rediss"):
        raise UsageError(f"invalid URI scheme in '{uri}' (trisque:// or redis://)")
    if scheme in ("trisques", "rediss"):
        opts.tls = True
    try:
        port = parts.port
    except ValueError:
        raise UsageError(f"invalid port in '{uri}'") from None
    if parts.hostname:
        opts.host = parts.hostname
    if port is not None:
        if not 0 < port < 65536:
            raise UsageError(f"invalid port {port}")
        opts.port = port
    if parts.password is not None:
        opts.password = unquote(parts.password)
        opts.user = unquote(parts.username) if parts.username else None
    elif parts.username:  # redis-cli: "redis://secret@host" is a password alone
        opts.password = unquote(parts.username)


def parse_argv(argv: list[str]) -> Options:
    """Options come first; the first word that is not an option starts the command, as in
    redis-cli, so a command's own arguments are never read as options."""
    opts = Options()
    i = 0

    def value(name: str) -> str:
        if i + 1 >= len(argv):
            raise UsageError(f"option {name} needs a value")
        return argv[i + 1]

    flags = {"--raw": "raw", "--no-raw": "tty", "--json": "json"}
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
            elif arg == "-u":
                parse_uri(value(arg), opts)
            elif arg == "-r":
                opts.repeat = int(value(arg))
            elif arg == "-i":
                opts.interval = float(value(arg))
                if opts.interval < 0:
                    raise UsageError("the interval cannot be negative")
            elif arg == "-X":
                opts.stdin_tag = value(arg)
            elif arg == "--pipe-timeout":
                opts.pipe_timeout = float(value(arg))
            elif arg[2:] in TLS_VALUES and arg.startswith("--"):
                opts.tls_files[arg[2:]] = value(arg)
            elif arg in ("--tls", "--insecure"):
                if arg == "--tls":
                    opts.tls = True
                else:
                    opts.insecure = True
                i += 1
                continue
            elif arg in flags or arg in ("-x", "--help", "-?") or arg[2:] in MODES:
                if arg in flags:
                    opts.output = flags[arg]
                elif arg == "-x":
                    opts.stdin_last_arg = True
                elif arg in ("--help", "-?"):
                    opts.show_help = True
                else:
                    if opts.mode is not None and opts.mode != arg[2:]:
                        raise UsageError(f"--{opts.mode} and {arg} cannot be combined")
                    opts.mode = arg[2:]
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
                break
        except ValueError:
            raise UsageError(f"invalid value for {arg}: {argv[i + 1]!r}") from None
        i += 2
    if opts.mode is not None and opts.command:
        raise UsageError(f"--{opts.mode} takes no command")
    if (opts.stdin_last_arg or opts.stdin_tag is not None) and not opts.command:
        raise UsageError("-x and -X need a command (an argument is read from stdin)")
    if opts.stdin_tag is not None and opts.stdin_tag not in opts.command:
        raise UsageError(f"-X {opts.stdin_tag}: no argument is '{opts.stdin_tag}'")
    if bool(opts.tls_files.get("cert")) != bool(opts.tls_files.get("key")):
        raise UsageError("--cert and --key go together")
    return opts
