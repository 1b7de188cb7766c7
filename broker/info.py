"""INFO: sections rendered in Disque's order with its field names.

Each section is a callable returning (field, value) pairs; the broker supplies Jobs and
Queues, the driver the sections that need the process (Server, Clients, Memory, Persistence,
Stats, CPU). An unknown section renders as an empty string, as in Disque.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ORDER = ("server", "clients", "memory", "jobs", "queues", "persistence", "stats", "cpu")
# ``INFO all`` adds these (as Redis and Disque do); ``INFO`` alone leaves them out.
EXTRA = ("federation", "timers", "jobstats", "allocations", "commandstats")
HEADERS = {"cpu": "CPU"}  # where Disque's header is not the capitalized name


def render(sources: dict[str, Callable[[], list[tuple[str, Any]]]], section: str) -> str:
    if section in ("all", "everything"):
        names: tuple[str, ...] = ORDER + EXTRA
    elif section == "default":
        names = ORDER
    else:
        names = (section,)
    parts = []
    for name in names:
        source = sources.get(name)
        if source is None:
            continue
        lines = [f"# {HEADERS.get(name, name.capitalize())}"]
        lines += [f"{k}:{v}" for k, v in source()]
        parts.append("\r\n".join(lines) + "\r\n")
    return "\r\n".join(parts)
