"""The version a node reports (INFO, HELLO): one place both the core and admin read."""

from __future__ import annotations

from typing import Final

VERSION: Final = "0.1.0"
