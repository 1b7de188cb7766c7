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

# The setup.py commands that build (pip runs bdist_wheel or editable_wheel).
BUILDS = {"build", "build_ext", "bdist_wheel", "bdist", "editable_wheel", "install", "develop"}


class BuildCore(build_core.CoreBuildExt):
    """build_ext for the core. mypyc runs when the command is finalized, just before it runs
    (not when setup.py is read, which pip does several times); the extensions it returns
    replace the placeholder. Any failure is a warning, and the pure modules are installed."""

    def finalize_options(self) -> None:
        self._hashes: dict[str, str] | None = None
        self._not_compiled: str | None = None
        if not set(self.distribution.commands) & BUILDS:
            # pip's metadata steps (egg_info, dist_info) finalize build_ext too: no mypyc there.
            self._not_compiled = f"setup.py {' '.join(self.distribution.commands)} builds nothing"
            self.distribution.ext_modules = []
            super().finalize_options()
            return
        if os.environ.get("TRISQUE_COMPILE", "1").strip() == "0":
            self._not_compiled = "TRISQUE_COMPILE=0"
        else:
            self._not_compiled = build_core.missing_tools()
        if self._not_compiled is None:
            try:
                self.distribution.ext_modules, self._hashes = build_core.translate_core()
            except build_core.CompileFailed as exc:
                self._not_compiled = str(exc)
        if self._not_compiled is not None:
            self.distribution.ext_modules = []
        super().finalize_options()

    def run(self) -> None:
        dest = build_core.ROOT if self.inplace else self.build_lib
        if self._not_compiled is None or not self.inplace:
            # Nothing of an older build may outlive this one; but TRISQUE_COMPILE=0 leaves a
            # checkout's own build alone (make build keeps it, and it is never used stale).
            build_core.clean(dest)
        if self._not_compiled is None:
            try:
                super().run()
            except build_core.CompileFailed as exc:
                self._not_compiled = str(exc)
                self.extensions = []
                build_core.clean(dest)
            else:
                assert self._hashes is not None
                build_core.write_stamp(dest, self._hashes)
                build_core.say(f"compiled the core into {dest}")
                return
        print(f"WARNING: the trisque core is not compiled: {self._not_compiled}. The "
              "pure-Python modules are installed (slower, same behaviour).", file=sys.stderr)


# The placeholder makes setuptools run build_ext and tag the wheel for this platform;
# BuildCore.finalize_options puts mypyc's extensions in its place.
setup(ext_modules=[Extension(build_core.GROUP_LIBRARY, sources=[])],
      cmdclass={"build_ext": BuildCore})
