"""trisque-server: parse the configuration, set up logging and the open-files limit, run a
node (``node.server.Server``) until it stops, and turn start-up problems into one clear line."""

from __future__ import annotations

import logging
import os
import sys

import trio

from broker.config import Config, ConfigError
from broker.version import VERSION
from node import config_file
from node.persistence import StartupError
from node.server import Server, ServerError, adjust_max_clients, log
from protocol import core_build


def setup_logging(config: Config) -> None:
    level = {"debug": logging.DEBUG, "verbose": logging.INFO, "notice": logging.INFO,
             "warning": logging.WARNING}[config.loglevel]
    fmt = logging.Formatter(f"{os.getpid()}:M %(asctime)s.%(msecs)03d %(levelchar)s %(message)s",
                            "%d %b %Y %H:%M:%S")
    handler: logging.Handler
    handler = logging.FileHandler(config.logfile) if config.logfile else logging.StreamHandler(sys.stdout)
    handler.setFormatter(fmt)
    handler.addFilter(_LevelChar())
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


class _LevelChar(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.levelchar = {logging.DEBUG: ".", logging.INFO: "*", logging.WARNING: "#"}.get(record.levelno, "#")
        return True


USAGE = """\
Usage: trisque-server [CONFIG_FILE] [--directive value ...]
       trisque-server --version | --help

Starts one trisque node. Directives are those of the config file (see conf/trisque.conf),
given on the command line as --name value; they override the file. Examples:
  trisque-server conf/trisque.conf
  trisque-server --port 7777 --dir /var/lib/trisque --appendonly yes
  trisque-server --http-port 7780   # HTTP API, dashboard at http://127.0.0.1:7780/, /metrics

The core runs compiled (mypyc, `make build`) when a build matching the sources is there, else
as plain Python; TRISQUE_CORE=pure or TRISQUE_CORE=compiled in the environment chooses. The
start log and INFO's trisque_core field say which one runs.
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    if args and args[0] in ("-v", "--version"):
        print(f"trisque-server v={VERSION}")
        return 0
    try:
        config = config_file.load(args)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    try:
        os.makedirs(config.dir, exist_ok=True)
        setup_logging(config)
    except OSError as exc:
        print(f"Can't use dir {config.dir!r}: {exc.strerror}", file=sys.stderr)
        return 1
    log.info("trisque %s, %s", VERSION, core_build.describe())
    adjust_max_clients(config)
    if config.pidfile:
        with open(config.pidfile, "w") as fh:
            fh.write(f"{os.getpid()}\n")
    try:
        http = None
        if config.http_port:  # the HTTP API's packages are imported only when it is on
            from node import http_front

            http = http_front.serve
        trio.run(Server(config, http=http).run)
    except (ServerError, StartupError) as exc:
        # One clear line where the operator looks (the log file and the terminal), no
        # traceback: these are problems with the data or the setup, not bugs.
        log.error("%s", exc)
        print(f"trisque-server: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if config.pidfile:
            try:
                os.unlink(config.pidfile)
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
