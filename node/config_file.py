"""The configuration file: reading it (with its includes) at start, and CONFIG REWRITE.

Theory of operation
-------------------
``broker/config.py`` owns the directives, their parsing and ranges, and how a file is rewritten
(``Config.rewritten``); this module only reads and writes files. A rewrite replaces the file
atomically: write a temporary file, fsync it, rename it over the old one, so a crash leaves
either the old file or the new one, never half of one.
"""

from __future__ import annotations

import os

from broker.config import Config, ConfigError


def read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"Fatal error, can't open config file '{path}': {exc.strerror}") from None


def load(argv: list[str]) -> Config:
    """``[CONFIG_FILE] [--directive value ...]`` as disque-server takes them: the file first,
    then the command line's directives over it."""
    cfg = Config()
    rest = list(argv)
    if rest and not rest[0].startswith("--"):
        cfg.config_file = os.path.abspath(rest.pop(0))
        cfg.load_lines(read_lines(cfg.config_file), cfg.config_file, read_lines)
    cfg.load_argv(rest)
    return cfg


def rewrite(cfg: Config) -> str | None:
    """CONFIG REWRITE: None, or the error text for the client."""
    if not cfg.config_file:
        return "The server is running without a config file"
    try:
        with open(cfg.config_file, encoding="utf-8") as fh:
            old = fh.read().splitlines()
    except OSError:
        old = []
    new = cfg.rewritten(old)
    tmp = cfg.config_file + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write("\n".join(new) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, cfg.config_file)
    except OSError as exc:
        return f"Rewriting config file: {exc.strerror}"
    return None
