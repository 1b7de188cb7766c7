"""A small Server-Sent Events reader over httpx for the dashboard tests (bounded in time)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx


@dataclass
class Event:
    name: str
    data: str
    id: str | None


def events(response: httpx.Response) -> Iterator[Event]:
    """The events of an open streaming response, as EventSource would see them."""
    name, data, event_id = "message", [], None
    for line in response.iter_lines():
        if line == "":
            if data:
                yield Event(name, "\n".join(data), event_id)
            name, data, event_id = "message", [], None
        elif line.startswith(":"):
            continue
        else:
            field, _, val = line.partition(":")
            val = val[1:] if val.startswith(" ") else val
            if field == "event":
                name = val
            elif field == "data":
                data.append(val)
            elif field == "id":
                event_id = val


def read_until_end(client: httpx.Client, url: str, timeout: float = 10.0,
                   headers: dict[str, str] | None = None) -> list[Event]:
    """Every event up to and including ``end`` (fails after ``timeout`` seconds)."""
    got: list[Event] = []
    deadline = time.monotonic() + timeout
    with client.stream("GET", url, headers=headers, timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for ev in events(r):
            got.append(ev)
            if ev.name == "end":
                return got
            assert time.monotonic() < deadline, got
    raise AssertionError(f"the stream closed without an end event: {got}")
