"""The compiled core and its guard (protocol/core_build.py, tools/build_core.py).

What must hold on either build: the modules loaded are the build that was chosen, an edited
source is never shadowed by its compiled module, ``TRISQUE_CORE`` is obeyed, and INFO says
which core runs (after Disque's fields, whose order stays Disque's).

The guard is tested twice: on a tree whose "extensions" are files that cannot be loaded (so
it needs no compiler: loading one fails loudly, which shows when the guard let it through),
and, when ``make build`` has compiled this checkout, on a copy of the real build.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from protocol import core_build
from tests.e2e.rawclient import RawConnection
from tests.support.server import ServerProcess
from tools import build_core

REPO = Path(__file__).resolve().parents[1]
SUFFIX = EXTENSION_SUFFIXES[0]


def _is_extension(path: str | None) -> bool:
    return path is not None and any(path.endswith(s) for s in EXTENSION_SUFFIXES)


def _run(tree: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` on the packages under ``tree``, with TRISQUE_CORE as given (unset
    unless given)."""
    child = {k: v for k, v in os.environ.items() if k not in ("TRISQUE_CORE", "PYTHONPATH")}
    child.update(env, PYTHONPATH=str(tree))
    return subprocess.run([sys.executable, "-c", code], cwd=tree, env=child,
                          capture_output=True, text=True, timeout=60)


def _copy_sources(dest: Path) -> None:
    for package in core_build.PACKAGES:
        (dest / package).mkdir()
        for source in (REPO / package).glob("*.py"):
            shutil.copy(source, dest / package / source.name)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_modules_loaded_are_the_build_that_was_chosen() -> None:
    build, why = core_build.decide()
    stamp = json.loads((REPO / "protocol" / core_build.STAMP).read_text()) \
        if build == core_build.COMPILED else {"modules": {}}
    compiled = set(stamp["modules"])
    checked = 0
    for package in core_build.PACKAGES:
        for source in sorted((REPO / package).glob("*.py")):
            rel = f"{package}/{source.name}"
            if source.name == "__init__.py":
                continue
            module = importlib.import_module(f"{package}.{source.stem}")
            assert _is_extension(module.__file__) == (rel in compiled), (rel, build, why)
            checked += 1
    assert checked > 30
    if build == core_build.COMPILED:
        # What tools/build_core.py compiles is what was compiled, and it is most of the core.
        assert sorted(compiled) == build_core.modules(str(REPO))
        assert len(compiled) >= 30 and "broker/core.py" in compiled


def test_every_module_kept_interpreted_exists_and_the_rest_are_compiled() -> None:
    for rel in build_core.INTERPRETED:
        assert (REPO / rel).is_file(), f"{rel} is listed in INTERPRETED but does not exist"
    compiled = build_core.modules(str(REPO))
    assert "protocol/resp.py" in compiled and "broker/aof.py" in compiled
    assert "protocol/core_build.py" not in compiled  # it must run before any compiled module
    assert not [m for m in compiled if m.endswith("__init__.py")]


def test_an_edited_source_is_never_shadowed_by_an_extension_of_it(tmp_path: Path) -> None:
    # Extensions that cannot be loaded: importing one fails, so a passing import proves the
    # guard did not let it through.
    _copy_sources(tmp_path)
    (tmp_path / "protocol" / f"jobid{SUFFIX}").write_bytes(b"not an ELF file")
    (tmp_path / f"{core_build.GROUP_LIBRARY}{SUFFIX}").write_bytes(b"not an ELF file")
    stamp = {"cache_tag": sys.implementation.cache_tag, "mypy": "test",
             "modules": {"protocol/jobid.py": _sha256(tmp_path / "protocol" / "jobid.py")}}
    (tmp_path / "protocol" / core_build.STAMP).write_text(json.dumps(stamp))
    probe = ("import protocol.jobid as j; from protocol import core_build as b; "
             "print(b.kind(), j.__file__, getattr(j, 'EDITED', False))")

    current = _run(tmp_path, probe)
    # The stamp matches: the "compiled" jobid is loaded, and fails.
    assert current.returncode != 0 and "ImportError" in current.stderr, current

    with open(tmp_path / "protocol" / "jobid.py", "a") as fh:
        fh.write("\nEDITED = True\n")
    edited = _run(tmp_path, probe)
    assert edited.returncode == 0, edited.stderr
    assert edited.stdout.split() == ["pure", str(tmp_path / "protocol" / "jobid.py"), "True"]
    assert "RuntimeWarning" in edited.stderr and "protocol/jobid.py changed" in edited.stderr

    required = _run(tmp_path, probe, TRISQUE_CORE="compiled")
    assert required.returncode != 0
    assert "TRISQUE_CORE=compiled, but the compiled core cannot be used: " \
           "protocol/jobid.py changed since it was compiled" in required.stderr


def test_an_extension_without_a_stamp_is_not_loaded(tmp_path: Path) -> None:
    _copy_sources(tmp_path)
    (tmp_path / "broker" / f"core{SUFFIX}").write_bytes(b"built by hand, say")
    run = _run(tmp_path, "import broker.core as c; print(c.__file__)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(tmp_path / "broker" / "core.py")
    assert f"broker/core{SUFFIX} has no build stamp" in run.stderr


def test_no_build_at_all_is_the_pure_core_without_a_warning(tmp_path: Path) -> None:
    _copy_sources(tmp_path)
    run = _run(tmp_path, "import broker.core; from protocol import core_build as b; "
                         "print(b.describe())")
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert run.stdout.strip() == "core: pure (not compiled (`make build` compiles it))"
    bad = _run(tmp_path, "import protocol", TRISQUE_CORE="fast")
    assert "TRISQUE_CORE must be auto, pure or compiled, not 'fast'" in bad.stderr


@pytest.mark.skipif(core_build.check()[0] is not None,
                    reason="needs this checkout compiled (make build): " + str(core_build.check()[0]))
def test_the_real_build_is_used_until_a_source_changes(tmp_path: Path) -> None:
    _copy_sources(tmp_path)
    for package in core_build.PACKAGES:
        for ext in (REPO / package).glob(f"*{SUFFIX}"):
            shutil.copy(ext, tmp_path / package / ext.name)
    shutil.copy(REPO / f"{core_build.GROUP_LIBRARY}{SUFFIX}", tmp_path)
    shutil.copy(REPO / "protocol" / core_build.STAMP, tmp_path / "protocol")
    probe = ("import broker.core as c, protocol.resp as r; from protocol import core_build as b;"
             "print(b.kind(), c.__file__, r.__file__, hasattr(r, 'EDITED'))")

    compiled = _run(tmp_path, probe)
    assert compiled.returncode == 0 and compiled.stderr == "", compiled.stderr
    kind, core_file, resp_file, edited = compiled.stdout.split()
    assert kind == "compiled" and core_file.endswith(SUFFIX) and resp_file.endswith(SUFFIX)
    assert edited == "False"

    with open(tmp_path / "protocol" / "resp.py", "a") as fh:
        fh.write("\nEDITED = True\n")
    pure = _run(tmp_path, probe)
    assert pure.returncode == 0, pure.stderr
    assert pure.stdout.split() == ["pure", str(tmp_path / "broker" / "core.py"),
                                   str(tmp_path / "protocol" / "resp.py"), "True"]
    assert "protocol/resp.py changed since it was compiled" in pure.stderr


def test_trisque_core_pure_is_obeyed() -> None:
    run = _run(REPO, "import broker.core as c; from protocol import core_build as b; "
                     "print(b.describe(), c.__file__)", TRISQUE_CORE="pure")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["core:", "pure", "(TRISQUE_CORE=pure)",
                                  str(REPO / "broker" / "core.py")]


def _reference_server_fields() -> list[str]:
    text = (REPO / "tests" / "fixtures" / "disque-reference-replies.md").read_text()
    section = text.split("## INFO (no argument) on a cluster node", 1)[1]
    server = section.split("# Server\n", 1)[1].split("\n\n", 1)[0]
    return [line.split(":", 1)[0] for line in server.splitlines()]


def test_info_server_keeps_disques_fields_and_ends_with_the_core_build() -> None:
    with ServerProcess() as node, RawConnection(node.port) as conn:
        text = conn.call("INFO", "server").decode()
    fields = [line.split(":", 1) for line in text.split("\r\n")[1:] if line]
    names = [name for name, _ in fields]
    reference = _reference_server_fields()
    assert len(reference) == 16 and reference[0] == "disque_version"
    assert names[: len(reference)] == reference
    assert fields[-1] == ["trisque_core", core_build.kind()]
    assert re.fullmatch(r"compiled|pure", fields[-1][1])


def test_the_installed_commands_run_outside_the_checkout_on_the_chosen_core(
        tmp_path: Path) -> None:
    """``make run`` starts ``.venv/bin/trisque-server``, and users run ``trisque``: with an
    editable install their imports go through the install's finder, which maps the packages
    but not the compiled core's shared library at the checkout's top. Before core_build loaded
    that library by its path, both failed with ``No module named 'trisque_core__mypyc'``."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "trisque-server").exists():
        pytest.skip("trisque is not installed in this interpreter's environment (pip install -e .)")
    child = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for command in ("trisque-server", "trisque"):
        run = subprocess.run([str(bin_dir / command), "--help"], cwd=tmp_path, env=child,
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and "Usage: " + command in run.stdout, run.stderr
    probe = subprocess.run(
        [sys.executable, "-c", "import broker.core as c; from protocol import core_build as b; "
                               "print(b.kind(), c.__file__)"],
        cwd=tmp_path, env=child, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    kind, core_file = probe.stdout.split()
    assert kind == core_build.kind()
    assert _is_extension(core_file) == (kind == core_build.COMPILED)
    assert Path(core_file).parent == REPO / "broker"
