"""The trio runtime of a node: the client server and its driver (``server.py``), the append
log's file I/O and group commit (``persistence.py``), the clock (``clock.py``), and later the
cluster bus. It moves bytes and time; every decision is in ``broker/`` and ``cluster/``."""

# Decided before any module of this package is imported: the hot-path modules listed in
# protocol/core_build.PARTLY_COMPILED are compiled with the core, or all run from source.
from protocol.core_build import decide

decide()
