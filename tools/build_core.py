"""Compile the core with mypyc: ``make build`` runs it in place; ``pip install`` through setup.py.

Usage: ``python -m tools.build_core [--require] [--check] [--clean]``

With no option it compiles ``modules()`` (every module of protocol/, broker/ and cluster/ but
those in ``INTERPRETED``, and node/'s hot path: ``PARTLY_COMPILED``) in place (extension modules beside their sources, and
the group's shared library ``trisque_core__mypyc`` at the top of the checkout) unless the build
there is current, printing its progress. Without mypyc or a C compiler, or if mypyc or the C
compiler fails, it warns and exits 0: the pure-Python modules run (``--require``: exit 1
instead, for CI). ``--check`` exits 0 when a current compiled build is in place and 1
otherwise, building nothing. ``--clean`` removes every compiled file and the stamp.

How a stale build is kept from running: the last step of a build, and only of one that
succeeded, writes the stamp ``protocol/compiled-core.json`` with the SHA-256 of each source
as it was read before compiling; at import, ``protocol/core_build.py`` loads the compiled
modules only if every source still has that hash. The stamp is deleted first thing, so a
build that fails half-way leaves nothing that looks current.

Which modules stay interpreted, and why, is ``INTERPRETED``.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

from setuptools import Distribution, Extension
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_core_build() -> ModuleType:
    """protocol/core_build.py by its path: importing it as ``protocol.core_build`` would run
    ``protocol/__init__``, which decides which build to load and warns about the stale one
    this tool is about to replace."""
    path = os.path.join(ROOT, "protocol", "core_build.py")
    spec = importlib.util.spec_from_file_location("_trisque_core_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_core_build = _load_core_build()
PACKAGES: tuple[str, ...] = _core_build.PACKAGES
PARTLY_COMPILED: dict[str, tuple[str, ...]] = _core_build.PARTLY_COMPILED
STAMP: str = _core_build.STAMP
GROUP_LIBRARY: str = _core_build.GROUP_LIBRARY
GROUP = GROUP_LIBRARY.removesuffix("__mypyc")
check = _core_build.check

# Modules left to the interpreter. Each reason is why compiling it would break something or
# gain nothing; a module not listed here is compiled.
INTERPRETED = {
    "protocol/core_build.py": "decides which build to load, so it runs before any compiled module",
    "broker/config.py": "Config sets one attribute per directive from the table at run time; "
                        "a native class has a fixed set of attributes",
    "cluster/messages.py": "its dataclasses have ClassVar fields, which mypyc's dataclasses "
                           "turn into instance fields (a mypyc limitation)",
    "cluster/sim.py": "the in-process cluster harness of the tests",
}

# mypyc's defaults are -O3 and -g1. -O2 without debug information took 10 % less compiler CPU
# (about 37 s against 41 s) and the core ran as fast: 13.9 against 13.8 us per ADDJOB and 8.6
# against 8.8 us per GETJOB in bench.builds' in-process loop, 5 runs each, interleaved.
OPT_LEVEL = "2"
DEBUG_LEVEL = "0"


def modules(root: str = ROOT) -> list[str]:
    """The sources to compile, relative to ``root``, sorted."""
    found: list[str] = []
    for package in PACKAGES:
        if package in PARTLY_COMPILED:
            found += PARTLY_COMPILED[package]
            continue
        for path in sorted(glob.glob(os.path.join(root, package, "*.py"))):
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if not rel.endswith("/__init__.py") and rel not in INTERPRETED:
                found.append(rel)
    return sorted(found)


def recipe() -> dict[str, str]:
    """How the build is made, besides its sources: a change is a rebuild."""
    try:
        import mypy.version
    except ImportError:
        mypy_version = "none"
    else:
        mypy_version = mypy.version.__version__
    return {"mypy": mypy_version, "opt_level": OPT_LEVEL, "debug_level": DEBUG_LEVEL}


def source_hashes(root: str, sources: list[str]) -> dict[str, str]:
    out = {}
    for rel in sources:
        with open(os.path.join(root, rel), "rb") as fh:
            out[rel] = hashlib.sha256(fh.read()).hexdigest()
    return out


def is_current(root: str = ROOT) -> bool:
    """A compiled build is in place, every source unchanged, built with this recipe for this
    list of modules."""
    problem, _stale = check(root)
    if problem is not None:
        return False
    with open(os.path.join(root, "protocol", STAMP), encoding="utf-8") as fh:
        stamp = json.load(fh)
    return bool(stamp.get("recipe") == recipe() and sorted(stamp["modules"]) == modules(root))


def say(text: str) -> None:
    print(f"build_core: {text}", flush=True)


class CompileFailed(Exception):
    """The core could not be compiled: the reason, for the warning."""


def missing_tools() -> str | None:
    """Why compiling cannot even start here (no mypyc, no C compiler, no Python headers)."""
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc is not installed (it comes with mypy: pip install mypy)"
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc}) found"
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"the Python headers are missing ({include}/Python.h; e.g. python3-dev)"
    return None


def translate(sources: list[str]) -> list[Extension]:
    """mypyc: type-check the sources and write their C into build/; the extensions to build.
    Must run with the working directory at the root (mypyc takes relative paths)."""
    from mypyc.build import mypycify

    try:
        extensions: list[Extension] = mypycify(
            sources, group_name=GROUP, multi_file=True, opt_level=OPT_LEVEL,
            debug_level=DEBUG_LEVEL)
    except SystemExit as exc:  # mypyc reports type errors and exits
        raise CompileFailed(f"mypyc failed ({exc.code})") from None
    return extensions


class CoreBuildExt(build_ext):
    """build_ext that compiles the C files of each extension in parallel (one extension holds
    nearly all of the core's code, which build_ext would compile one file at a time), prints
    a line per file, and turns a failure into ``CompileFailed``."""

    jobs = max(1, os.cpu_count() or 1)

    def build_extensions(self) -> None:
        serial = self.compiler.compile
        total = sum(len(ext.sources) for ext in self.extensions)
        done = [0]

        def parallel(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
            def one(source: str) -> str:
                started = time.monotonic()
                objects: list[str] = serial([source], *args, **kwargs)
                done[0] += 1
                say(f"  [{done[0]:>2}/{total}] {os.path.relpath(source, 'build')} "
                    f"({time.monotonic() - started:.1f} s)")
                return objects[0]

            # The biggest files first, so that no long one starts last while the other
            # compiler sits idle; the objects are returned in the sources' order.
            by_size = sorted(sources, key=lambda src: -os.path.getsize(src))
            with ThreadPoolExecutor(self.jobs) as pool:
                futures = {src: pool.submit(one, src) for src in by_size}
                return [futures[src].result() for src in sources]

        self.compiler.compile = parallel
        try:
            for ext in self.extensions:
                self.build_extension(ext)
        except Exception as exc:  # CompileError, LinkError, OSError...
            raise CompileFailed(f"the C compiler failed: {exc}") from exc
        finally:
            self.compiler.compile = serial


def write_stamp(dest: str, hashes: dict[str, str]) -> None:
    stamp = {
        "format": 1,
        "mypy": recipe()["mypy"],
        "cache_tag": sys.implementation.cache_tag,
        "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "recipe": recipe(),
        "modules": hashes,
    }
    path = os.path.join(dest, "protocol", STAMP)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(stamp, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def compiled_files(root: str) -> list[str]:
    """Every file a build puts in ``root``: extension modules, the group library, the stamp."""
    from importlib.machinery import EXTENSION_SUFFIXES

    found: list[str] = []
    for pattern in [os.path.join(root, p, "*") for p in PACKAGES] + [
            os.path.join(root, GROUP_LIBRARY + "*")]:
        found += [p for p in glob.glob(pattern) if any(p.endswith(s) for s in EXTENSION_SUFFIXES)]
    stamp = os.path.join(root, "protocol", STAMP)
    return sorted(found + ([stamp] if os.path.exists(stamp) else []))


def clean(root: str = ROOT) -> int:
    files = compiled_files(root)
    for path in files:
        os.remove(path)
    return len(files)


def translate_core() -> tuple[list[Extension], dict[str, str]]:
    """The first half of a build: the sources' hashes (read before compiling, so an edit made
    meanwhile shows as stale), then mypyc. Raises CompileFailed."""
    sources = modules()
    hashes = source_hashes(ROOT, sources)
    started = time.monotonic()
    say(f"compiling the core with mypyc: {len(sources)} modules of {', '.join(PACKAGES)} "
        f"(about 50 s of CPU: a minute or less on 2 idle cores, 2 on busy ones)")
    say("[1/2] mypyc: type-checking and translating to C ...")
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        extensions = translate(sources)
    finally:
        os.chdir(cwd)
    c_files = sum(len(e.sources) for e in extensions)
    say(f"[1/2] done in {time.monotonic() - started:.0f} s: {c_files} C files in build/")
    say(f"[2/2] C compiler: {c_files} files, {CoreBuildExt.jobs} at a time ...")
    return extensions, hashes


def compile_core(dest: str, inplace: bool) -> float:
    """Compile ``modules()`` under ``dest`` and write the stamp; the seconds it took.
    Raises CompileFailed."""
    started = time.monotonic()
    stamp = os.path.join(dest, "protocol", STAMP)
    if os.path.exists(stamp):
        os.remove(stamp)  # from here until the end, nothing looks current
    extensions, hashes = translate_core()
    compiling = time.monotonic()
    cwd = os.getcwd()
    os.chdir(ROOT)  # the extensions name their C files relative to the root
    try:
        dist = Distribution({"name": "trisque-core", "ext_modules": extensions,
                             "cmdclass": {"build_ext": CoreBuildExt}})
        dist.verbose = 0  # our progress lines instead of every compiler command line
        cmd = dist.get_command_obj("build_ext")
        cmd.inplace = inplace
        # Always compile: build_ext judges by file times and would keep objects built with
        # other flags; a build only runs when something changed anyway.
        cmd.force = True
        dist.run_command("build_ext")
    finally:
        os.chdir(cwd)
    say(f"[2/2] done in {time.monotonic() - compiling:.0f} s")
    write_stamp(dest, hashes)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.build_core", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--require", action="store_true",
                        help="exit 1 if the core cannot be compiled (CI)")
    parser.add_argument("--check", action="store_true",
                        help="exit 0 if a current compiled build is in place, else 1")
    parser.add_argument("--clean", action="store_true", help="remove the compiled build")
    args = parser.parse_args(argv)
    if args.clean:
        say(f"removed {clean()} compiled files")
        return 0
    if args.check:
        return 0 if is_current() else 1
    if is_current():
        say(f"the compiled core is up to date ({len(modules())} modules)")
        return 0
    try:
        problem = missing_tools()
        if problem is not None:
            raise CompileFailed(problem)
        clean()  # no extension of an older build may outlive it (a module made interpreted)
        seconds = compile_core(ROOT, inplace=True)
    except CompileFailed as exc:
        clean()
        print(f"build_core: WARNING: the core is not compiled: {exc}. The pure-Python "
              "modules run (slower, same behaviour).", file=sys.stderr, flush=True)
        return 1 if args.require else 0
    say(f"compiled the core in {seconds:.0f} s; INFO's trisque_core field shows which build a "
        "node runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
