"""Which build of the core this process runs: the mypyc-compiled modules or the pure Python.

Theory of operation
-------------------
``make build`` (``tools/build_core.py``, which ``pip install`` also runs through ``setup.py``)
compiles the core modules of ``protocol/``, ``broker/`` and ``cluster/``, and the node's hot
path (``node/conn_core.py``, ``node/conn_state.py``, ``node/reactor_core.py``,
``node/round_core.py``, ``node/log_core.py``, ``node/bus_core.py``, ``node/bodies.py``:
``PARTLY_COMPILED``), with mypyc into extension modules beside their sources, plus one shared library holding all of their code
(``trisque_core__mypyc``), and then writes ``STAMP`` beside this file: the SHA-256 of every
source it compiled. Python prefers an extension module to the ``.py`` of the same name, so an
extension left behind after its source was edited would silently run the old code. This
module stops that. The ``__init__`` of each compiled package calls ``decide()`` before any of
its modules is imported, and the first call decides for the whole process:

* ``compiled`` — the stamp is there, was made for this interpreter, every source it names
  still has the hash it had when it was compiled, and every extension is in place: imports
  go on as usual and load the extensions;
* ``pure`` — otherwise, or when ``TRISQUE_CORE=pure``: a finder placed first on
  ``sys.meta_path`` answers for every module of the compiled packages with its source (or
  bytecode) only, so no extension of the core is loaded. All of them or none: compiled
  modules call each other directly in C, so one edited module run from source beside its
  compiled callers would still be bypassed by them.

A build that is there but stale gives a ``RuntimeWarning`` naming the first changed file
(``make build`` recompiles). ``TRISQUE_CORE=compiled`` turns every reason for the pure build
into an ImportError, so a run that must test the compiled core (CI) cannot pass on the pure
one. This module is never compiled itself: it must run before any compiled module loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import (
    BYTECODE_SUFFIXES,
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    FileFinder,
    ModuleSpec,
    SourceFileLoader,
    SourcelessFileLoader,
)
from importlib.util import module_from_spec, spec_from_file_location
from types import ModuleType
from typing import Any

COMPILED = "compiled"
PURE = "pure"
#: The packages whose modules may be compiled (each one's __init__ calls decide()).
PACKAGES = ("protocol", "broker", "cluster", "node")
#: Of those, the packages compiled only in part, and the modules of theirs that are: node/ is
#: trio code but for its hot path, which is kept free of trio so that mypyc can compile it.
PARTLY_COMPILED = {"node": ("node/bodies.py", "node/bus_core.py", "node/conn_core.py",
                            "node/conn_state.py", "node/reactor_core.py",
                            "node/round_core.py", "node/log_core.py", "node/tls_stream.py")}
#: The build stamp, beside this file: written by tools/build_core.py after a build succeeded.
STAMP = "compiled-core.json"
#: The shared library mypyc builds for the group (tools/build_core.py names the group after it).
GROUP_LIBRARY = "trisque_core__mypyc"
ENV = "TRISQUE_CORE"

# The directory that holds the packages (the checkout, or site-packages).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_decision: tuple[str, str] | None = None  # (COMPILED or PURE, why), once per process


def decide() -> tuple[str, str]:
    """(``"compiled"`` or ``"pure"``, the reason). Each compiled package's ``__init__`` calls
    it before any of its modules is imported; the first call decides for the process."""
    global _decision
    if _decision is None:
        _decision = _decide()
        if _decision[0] == PURE:
            sys.meta_path.insert(0, _SourceOnlyFinder())
        else:
            _load_group_library()
    return _decision


def _load_group_library() -> None:
    """Load the shared library that ``check`` found under ``_ROOT``, by its path. Each compiled
    module imports it by its top-level name, which an editable install's finder does not map
    (it maps the packages only): ``trisque-server`` started outside the checkout would fail
    with ``No module named 'trisque_core__mypyc'``. Loading the checked file itself serves
    every way of running: in the checkout, an editable install, site-packages."""
    if GROUP_LIBRARY in sys.modules:
        return
    path = _extension_path(os.path.join(_ROOT, GROUP_LIBRARY))
    assert path is not None, "check() found it"
    spec = spec_from_file_location(GROUP_LIBRARY, path)
    assert spec is not None and spec.loader is not None
    library = module_from_spec(spec)
    sys.modules[GROUP_LIBRARY] = library
    spec.loader.exec_module(library)


def kind() -> str:
    """``"compiled"`` or ``"pure"``: what INFO's ``trisque_core`` field shows."""
    return decide()[0]


def describe() -> str:
    """One line for the start-up log: which core runs, and why."""
    build, why = decide()
    return f"core: {build} ({why})"


def _decide() -> tuple[str, str]:
    wanted = os.environ.get(ENV, "").strip().lower()
    if wanted not in ("", "auto", PURE, COMPILED):
        raise ImportError(f"{ENV} must be auto, pure or compiled, not {wanted!r}")
    if wanted == PURE:
        return PURE, f"{ENV}=pure"
    problem, stale = check()
    if problem is None:
        stamp = _read_stamp()
        assert stamp is not None
        return COMPILED, f"mypyc {stamp.get('mypy', '?')}, {len(stamp['modules'])} modules"
    if wanted == COMPILED:
        raise ImportError(f"{ENV}=compiled, but the compiled core cannot be used: {problem}")
    if stale:
        warnings.warn(f"trisque: running the pure-Python core: {problem}; `make build` "
                      "compiles it again", RuntimeWarning, stacklevel=3)
    return PURE, problem


def check(root: str = _ROOT) -> tuple[str | None, bool]:
    """(None, False) if the compiled core under ``root`` can be used; otherwise why not, and
    whether a build is there but out of date (worth a warning) rather than simply absent."""
    stamp = _read_stamp(root)
    if stamp is None:
        leftover = _any_extension(root)
        if leftover:
            return f"{leftover} has no build stamp ({STAMP}) to check it against", True
        return "not compiled (`make build` compiles it)", False
    if stamp.get("cache_tag") != sys.implementation.cache_tag:
        return f"compiled for {stamp.get('cache_tag')}, not {sys.implementation.cache_tag}", True
    if not _extension(os.path.join(root, GROUP_LIBRARY)):
        return f"{GROUP_LIBRARY} is missing", True
    for source, digest in sorted(stamp["modules"].items()):
        path = os.path.join(root, source)
        try:
            with open(path, "rb") as fh:
                current = hashlib.sha256(fh.read()).hexdigest()
        except OSError:
            return f"{source} is gone", True
        if current != digest:
            return f"{source} changed since it was compiled", True
        if not _extension(path[: -len(".py")]):
            return f"the compiled {source} is missing", True
    return None, False


def _read_stamp(root: str = _ROOT) -> dict[str, Any] | None:
    try:
        with open(os.path.join(root, "protocol", STAMP), encoding="utf-8") as fh:
            stamp = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or not isinstance(stamp.get("modules"), dict):
        return None
    return stamp


def _extension_path(stem: str) -> str | None:
    """The extension module ``stem`` + one of this interpreter's suffixes, if there is one."""
    for suffix in EXTENSION_SUFFIXES:
        if os.path.exists(stem + suffix):
            return stem + suffix
    return None


def _extension(stem: str) -> bool:
    return _extension_path(stem) is not None


def _any_extension(root: str) -> str | None:
    """The first extension module found in the compiled packages (relative path), if any."""
    for package in PACKAGES:
        try:
            names = sorted(os.listdir(os.path.join(root, package)))
        except OSError:
            continue
        for name in names:
            if any(name.endswith(suffix) for suffix in EXTENSION_SUFFIXES):
                return f"{package}/{name}"
    return None


class _SourceOnlyFinder:
    """A meta path finder: the modules of the compiled packages from their sources, never an
    extension. (Not importlib.abc.MetaPathFinder: importing that costs every process 10 ms.)"""

    def __init__(self) -> None:
        self._finders: dict[str, FileFinder] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if path is None or fullname.partition(".")[0] not in PACKAGES:
            return None
        for entry in path:
            finder = self._finders.get(entry)
            if finder is None:
                finder = self._finders[entry] = FileFinder(
                    entry, (SourceFileLoader, SOURCE_SUFFIXES),
                    (SourcelessFileLoader, BYTECODE_SUFFIXES))
            spec = finder.find_spec(fullname, target)
            if spec is not None:
                return spec
        return None

    def invalidate_caches(self) -> None:
        for finder in self._finders.values():
            finder.invalidate_caches()
