"""What the wheel installs: pyproject.toml's package list against the packages in the checkout.

setuptools installs exactly the packages listed, subpackages included only when named, so a new
package (or subpackage) left out of the list would be missing from ``pip install .`` while every
test run from the checkout still passes.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Programs and tests that live in the checkout only.
NOT_INSTALLED = {"bench", "tests", "tools"}


def pyproject() -> dict[str, object]:
    with open(REPO / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)


def installed_packages() -> list[str]:
    packages = pyproject()["tool"]["setuptools"]["packages"]  # type: ignore[index]
    assert isinstance(packages, list)
    return sorted(packages)


def checkout_packages() -> list[str]:
    """The top-level packages of the checkout (but NOT_INSTALLED) and their subpackages."""
    found = []
    for top in REPO.glob("*/__init__.py"):
        if top.parent.name in NOT_INSTALLED:
            continue
        for init in top.parent.glob("**/__init__.py"):
            found.append(".".join(init.parent.relative_to(REPO).parts))
    return sorted(found)


def test_every_package_of_the_checkout_is_installed() -> None:
    assert "client" in checkout_packages()
    assert installed_packages() == checkout_packages()


def test_benchmarks_tools_and_tests_are_not_installed() -> None:
    assert (REPO / "bench" / "table.py").exists()
    assert not NOT_INSTALLED & {name.split(".")[0] for name in installed_packages()}


def test_every_command_runs_an_installed_module() -> None:
    scripts = pyproject()["project"]["scripts"]  # type: ignore[index]
    assert isinstance(scripts, dict) and "trisque-benchmark" in scripts
    installed = set(installed_packages())
    for name, target in scripts.items():
        module = target.split(":")[0]
        assert module.rsplit(".", 1)[0] in installed, f"{name} runs {module}, not installed"
        assert (REPO / (module.replace(".", "/") + ".py")).exists(), f"{name}: no {module}"


def test_the_trisque_script_runs_cli_main_and_imports_nothing_before_it() -> None:
    """`trisque` is a script file (scripts/trisque says why): pip rewrites only its first line
    when it installs it, and it must start `cli.main` with nothing else imported first."""
    files = pyproject()["tool"]["setuptools"]["script-files"]  # type: ignore[index]
    assert files == ["scripts/trisque"]
    script = (REPO / "scripts" / "trisque").read_text()
    first, rest = script.split("\n", 1)
    assert first.startswith("#!") and "python" in first
    imports = [line for line in rest.splitlines() if line.startswith(("import ", "from "))]
    assert imports == ["import sys", "from cli.main import main"]
    assert "trisque" not in pyproject()["project"]["scripts"]  # type: ignore[index]
