"""The dependency direction between packages, checked on the source with ``ast``.

protocol  -> stdlib, hiredis, msgpack (trio only in the trio client flavour: a module whose
             name contains "aio", e.g. protocol/aio_client.py)
broker    -> stdlib, msgpack, protocol
cluster   -> stdlib but time/socket/os/trio/asyncio/select(ors), msgpack, cryptography,
             broker, protocol (sans-IO)
cli       -> anything
pipeline  -> anything but cli
Nothing outside cli imports cli; nothing outside pipeline and cli imports pipeline.

Every import counts, including those under ``if TYPE_CHECKING:`` or inside functions, and
``importlib.import_module("...")`` / ``__import__("...")`` calls with a literal name: a
wrong-way edge is a wrong-way edge however it is spelled.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("protocol", "broker", "cluster", "cli", "pipeline")
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}
# Third-party distributions the project declares (pyproject.toml), by import name.
DECLARED = frozenset({"trio", "hiredis", "msgpack", "cryptography", "pyspark"})
# cluster/ is sans-IO: no clock, socket, file system or event loop, even from the stdlib.
SANS_IO_FORBIDDEN = frozenset({"time", "socket", "os", "trio", "asyncio", "select", "selectors"})


def allowed(package: str, module_file: str, imported: str) -> bool:
    """May ``package``'s module ``module_file`` import the top-level module ``imported``?"""
    if package == "cluster" and imported in SANS_IO_FORBIDDEN:
        return False
    if imported == package or imported in STDLIB:
        return True
    if package == "protocol":
        return imported in ("hiredis", "msgpack") or (imported == "trio" and "aio" in module_file)
    if package == "broker":
        return imported in ("msgpack", "protocol")
    if package == "cluster":
        return imported in ("msgpack", "cryptography", "broker", "protocol")
    if package == "pipeline":
        return imported != "cli"
    return package == "cli"


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
        ("cluster/bus.py", "import trio"),
        ("cluster/membership.py", "import time"),
        ("cluster/bus.py", "from pipeline import spark"),
        ("pipeline/job.py", "from cli import server"),
        ("protocol/aio_client.py", "import broker"),
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
        ("protocol/aio_client.py", "import trio\nfrom protocol.resp import encode"),
        ("protocol/client.py", "from .resp import encode\nfrom . import resp"),
        ("broker/core.py", "from protocol.resp import Error\nfrom .job import Job\nimport msgpack"),
        ("broker/log/format.py", "from ..job import Job\nfrom ...protocol import resp"),
        ("cluster/bus.py", "import msgpack\nfrom broker.core import Broker\nfrom protocol import resp"),
        ("cli/server.py", "import trio\nimport cluster\nimport broker\nimport pipeline"),
        ("pipeline/spark.py", "import pyspark\nfrom protocol import client"),
    ],
)
def test_checker_accepts_right_way_imports(relpath: str, source: str) -> None:
    assert violations_in(source, relpath) == []
