"""The log's CRC-32 (protocol/checksum.py) is zlib's: logs written before it, and the CRCs a
``BodyRef`` holds, stay valid."""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from protocol.checksum import crc32


@given(st.binary(max_size=5000))
def test_crc32_is_zlibs(data: bytes) -> None:
    assert crc32(data) == zlib.crc32(data)


def test_crc32_of_a_large_buffer_and_a_memoryview() -> None:
    data = bytes(range(256)) * 4099
    assert crc32(data) == zlib.crc32(data)
    assert crc32(memoryview(data)[7:70_001]) == zlib.crc32(data[7:70_001])
