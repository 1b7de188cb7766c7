"""Requests as the dashboard's own buttons send them: from the node's origin, with the CSRF
token the page embeds for its user."""

from __future__ import annotations

import httpx


def page_token(page: str) -> str:
    """The CSRF token a dashboard page embeds (its ``csrf-token`` meta tag)."""
    marker = '<meta name="csrf-token" content="'
    start = page.index(marker) + len(marker)
    return page[start:page.index('"', start)]


def button_headers(http: httpx.Client, base: str) -> dict[str, str]:
    """Headers of a button's request: the page's origin and token, for ``http``'s user."""
    return {"Origin": base, "Sec-Fetch-Site": "same-origin",
            "X-CSRF-Token": page_token(http.get("/").text)}
