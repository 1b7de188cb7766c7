"""Packaging glue for the compiled core; the project's metadata is in pyproject.toml.

``pip install .`` (a wheel) compiles the core with mypyc through ``tools/build_core.py`` and
ships the extensions with the sources and the build stamp; ``protocol/core_build.py`` loads
them only while the sources still match the stamp. Without mypyc or a C compiler the install
warns and ships the pure-Python modules. ``TRISQUE_COMPILE=0`` skips compiling: the Makefile
installs that way and then compiles in place with ``make build``, where the progress shows.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tools import build_core  # noqa: E402


class BuildCore(build_core.CoreBuildExt):
    """build_ext for the core: the extensions come from mypyc when the command runs (not when
    setup.py is read, which pip does several times), and a failure is a warning."""

    def run(self) -> None:
        self.extensions: list[Extension] = []
        self.distribution.ext_modules = []
        if os.environ.get("TRISQUE_COMPILE", "1").strip() == "0":
            build_core.say("TRISQUE_COMPILE=0: installing the pure-Python core")
            return
        dest = build_core.ROOT if self.inplace else self.build_lib

        def build(extensions: list[Extension]) -> None:
            self.extensions = extensions
            self.distribution.ext_modules = extensions
            super(BuildCore, self).run()

        try:
            problem = build_core.missing_tools()
            if problem is not None:
                raise build_core.CompileFailed(problem)
            build_core.compile_core(dest, self.inplace, build)
        except build_core.CompileFailed as exc:
            self.extensions = []
            self.distribution.ext_modules = []
            build_core.clean(dest)
            print(f"WARNING: the trisque core is not compiled: {exc}. The pure-Python "
                  "modules are installed (slower, same behaviour).", file=sys.stderr)


# The placeholder makes setuptools run build_ext and tag the wheel for this platform;
# BuildCore.run puts the real extensions in its place.
setup(ext_modules=[Extension(build_core.GROUP_LIBRARY, sources=[])],
      cmdclass={"build_ext": BuildCore})
