"""The dependency direction between packages, checked on the source with ``ast``.

protocol  -> stdlib, hiredis, msgpack, mypy_extensions
client    -> stdlib, protocol (trio only in the trio flavour: a module whose name contains "aio",
             client/aio.py)
broker    -> stdlib but no clock, socket, os or trio (sans-IO), msgpack, protocol
cluster   -> stdlib but no clock, socket, os or trio (sans-IO), msgpack, cryptography,
             mypy_extensions, broker, protocol
node      -> stdlib, declared dependencies, protocol, broker, cluster (the trio runtime); its
             modules compiled with the core (protocol/core_build.PARTLY_COMPILED) no trio
cli       -> anything but bench and tests
pipeline  -> anything but cli, node, bench and tests
bench     -> anything (the benchmark programs, run from the checkout; tests/support included)
Besides bench: nothing outside cli imports cli; nothing outside node and cli imports node;
nothing outside pipeline and cli imports pipeline; the server's packages (protocol, broker,
cluster, node) do not import client; nothing imports bench or tests (the tests import bench,
which this does not check).
The files of the append log and the config file are opened in ``node/`` (logfile.py,
config_file.py); broker/aof.py reads records from a stream it is given.

Every import counts, including those under ``if TYPE_CHECKING:`` or inside functions, and
``importlib.import_module("...")`` / ``__import__("...")`` calls with a literal name: a
wrong-way edge is a wrong-way edge however it is spelled.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from protocol.core_build import PARTLY_COMPILED

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("protocol", "client", "broker", "cluster", "node", "cli", "pipeline", "bench")
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}
# Third-party distributions the project declares (pyproject.toml), by import name.
DECLARED = frozenset({"trio", "hiredis", "msgpack", "cryptography", "pyspark", "hypercorn",
                      "starlette", "jinja2", "prometheus_client", "mypy_extensions",
                      "zlib_ng"})
# Standard modules that read the clock, open sockets or touch the OS: the sans-IO packages
# take time and messages as arguments instead.
IO_MODULES = {
    "broker": frozenset({"time", "socket", "select", "selectors", "asyncio", "threading",
                         "os", "shutil", "tempfile", "pathlib", "subprocess"}),
    "cluster": frozenset({"time", "socket", "select", "selectors", "asyncio", "threading",
                          "os", "shutil", "tempfile", "pathlib", "subprocess"}),
}
# The node's modules that mypyc compiles with the core: trio-free, so that it can.
COMPILED_NODE_FILES = frozenset(Path(rel).name for rel in PARTLY_COMPILED.get("node", ()))


def allowed(package: str, module_file: str, imported: str) -> bool:
    """May ``package``'s module ``module_file`` import the top-level module ``imported``?"""
    if package == "bench":
        return True
    if imported in IO_MODULES.get(package, ()) or imported == "bench":
        return False
    if imported == package or imported in STDLIB:
        return True
    if package == "protocol":
        # mypy_extensions: mypyc's class attributes (protocol/resp.py's str subclasses);
        # zlib_ng: the log's CRC-32 (protocol/checksum.py).
        return imported in ("hiredis", "msgpack", "mypy_extensions", "zlib_ng")
    if package == "client":
        return imported == "protocol" or (imported == "trio" and "aio" in module_file)
    if package == "broker":
        return imported in ("msgpack", "protocol")
    if package == "cluster":
        # mypy_extensions: mypyc's class attributes (cluster/effects.py's base of the cores).
        return imported in ("broker", "protocol", "msgpack", "cryptography", "mypy_extensions")
    if package == "node":
        if imported == "trio" and module_file in COMPILED_NODE_FILES:
            return False
        return imported in ("protocol", "broker", "cluster") or imported in DECLARED
    if package == "pipeline":
        return imported not in ("cli", "node", "tests")
    return package == "cli" and imported != "tests"


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute dotted name) for every import in a module named ``module``."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # Relative: resolve against the importing module's package.
                parts = module.split(".")
                base = parts if is_package else parts[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("__import__", "import_module"))
            )
        ):
            out.append((node.lineno, node.args[0].value))
    return out


def violations_in(source: str, relpath: str) -> list[str]:
    """Wrong-way imports in one file, as 'path:line: imports X' messages."""
    parts = Path(relpath).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    module = ".".join(parts[:-1] if is_package else parts)
    package = parts[0]
    tree = ast.parse(source, filename=relpath)
    found = []
    for line, name in imported_names(tree, module, is_package):
        top = name.split(".")[0]
        if not top:
            found.append(f"{relpath}:{line}: relative import escapes the packages ({name!r})")
        elif not allowed(package, Path(relpath).name, top):
            found.append(f"{relpath}:{line}: {package} must not import {top} ('{name}')")
    return found


def project_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def test_no_wrong_way_imports() -> None:
    files = project_files()
    # The walk must have found the code, or this test would pass on nothing.
    assert REPO / "protocol" / "resp.py" in files
    problems = []
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        problems += violations_in(path.read_text(), rel)
    assert not problems, "wrong-way imports:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize(
    "relpath, source",
    [
        ("protocol/resp.py", "import trio"),
        ("protocol/commands.py", "from broker.core import Broker"),
        ("protocol/x.py", "import requests"),
        ("broker/core.py", "import trio"),
        ("broker/core.py", "from trio import sleep"),
        ("broker/core.py", "from cluster import bus"),
        ("broker/core.py", "from ..cluster import bus"),
        ("broker/core.py", "def f():\n    import cli.server"),
        ("broker/core.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pipeline"),
        ("broker/core.py", "import importlib\nimportlib.import_module('cli.server')"),
        ("broker/__init__.py", "from .. import cli"),
        ("cluster/bus.py", "import cli.server"),
        ("cluster/bus.py", "from pipeline import spark"),
        ("pipeline/job.py", "from cli import server"),
        ("client/aio.py", "import broker"),
        ("client/blocking.py", "import trio"),
        ("protocol/commands.py", "from client.core import Call"),
        ("node/server.py", "from client import blocking"),
        ("broker/core.py", "import time"),
        ("broker/core.py", "from socket import socket"),
        ("broker/core.py", "import node.server"),
        ("broker/aof.py", "import os"),
        ("broker/config.py", "from os import path"),
        ("cluster/membership.py", "import os"),
        ("cluster/membership.py", "import trio"),
        ("node/server.py", "import cli.server"),
        ("node/conn_core.py", "import trio"),
        ("node/reactor_core.py", "from trio import lowlevel"),
        ("node/round_core.py", "import trio"),
        ("pipeline/job.py", "from node import server"),
        ("cli/bench.py", "from bench.servers import BenchServer"),
        ("cli/main.py", "from tests.support.server import free_port"),
        ("pipeline/spark.py", "from bench import spark"),
        ("node/server.py", "import bench"),
    ],
)
def test_checker_flags_wrong_way_imports(relpath: str, source: str) -> None:
    problems = violations_in(source, relpath)
    assert problems, f"{relpath}: {source!r} should be refused"
    assert problems[0].startswith(f"{relpath}:"), problems


@pytest.mark.parametrize(
    "relpath, source",
    [
        ("protocol/resp.py", "import hiredis\nimport msgpack\nfrom typing import Final"),
        ("client/aio.py", "import trio\nfrom protocol.resp import encode"),
        ("client/blocking.py", "from .core import Call\nfrom protocol import resp\nimport socket"),
        ("cli/worker/loop.py", "from client.aio import AsyncClient"),
        ("broker/core.py", "from protocol.resp import Error\nfrom .job import Job\nimport msgpack"),
        ("broker/log/format.py", "from ..job import Job\nfrom ...protocol import resp"),
        ("cluster/wire.py", "import msgpack\nfrom broker.core import Broker\nfrom protocol import resp"),
        ("node/server.py", "import trio\nimport socket\nfrom cluster import wire\nfrom broker import core"),
        ("cli/server.py", "import trio\nimport cluster\nimport broker\nimport pipeline"),
        ("pipeline/spark.py", "import pyspark\nfrom client import blocking"),
        ("bench/table.py", "import trio\nfrom cli.bench import run_benchmark\nimport tests.support"),
    ],
)
def test_checker_accepts_right_way_imports(relpath: str, source: str) -> None:
    assert violations_in(source, relpath) == []


def test_no_import_cycles_between_modules() -> None:
    """Modules import each other in one direction only, typing imports included (the
    admin/core circle). A cycle is reported as the modules it runs through."""
    graph: dict[str, set[str]] = {}
    for path in project_files():
        rel = path.relative_to(REPO).with_suffix("")
        is_package = rel.name == "__init__"
        module = ".".join(rel.parts[:-1] if is_package else rel.parts)
        tree = ast.parse(path.read_text(), filename=str(path))
        names = {name for _, name in imported_names(tree, module, is_package)}
        # ``from broker import admin`` names the package; the edge goes to broker.admin.
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
        graph[module] = names
    modules = set(graph)
    for names in graph.values():
        # A package named only as the source of a submodule import is not itself depended on.
        for name in list(names):
            if any(other.startswith(name + ".") and other in modules for other in names):
                names.discard(name)
    edges = {m: {n for n in deps if n in modules and n != m} for m, deps in graph.items()}

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, path = stack.pop()
            for nxt in edges.get(node, ()):
                if nxt == start:
                    return path + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = [c for m in sorted(edges) if (c := cycle_from(m))]
    assert not cycles, "import cycles:\n  " + "\n  ".join(" -> ".join(c) for c in cycles)
