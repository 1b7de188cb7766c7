"""The multi-process cluster fixture (tests/support/cluster.py) for the system tests."""

from tests.support.cluster import local_cluster

__all__ = ["local_cluster"]
