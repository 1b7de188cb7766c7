"""Reading a fuzzer's printed report in a test."""

from __future__ import annotations


def report(out: str, limit: int = 20_000) -> str:
    """The part of a fuzzer's output that explains a failure: everything from its first
    PROBLEM line on (a logged traceback can be long), else its tail."""
    at = out.find("PROBLEM:")
    return out[at:at + limit] if at >= 0 else out[-3000:]
