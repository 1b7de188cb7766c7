"""The trio runtime of a node: the client server and its driver (``server.py``), the append
log's file I/O and group commit (``persistence.py``), the clock (``clock.py``), and later the
cluster bus. It moves bytes and time; every decision is in ``broker/`` and ``cluster/``."""
