"""``trisque check-log FILE [--fix]``: verify an append log, and cut a torn tail on request.

Theory of operation
-------------------
The file is read with the same reader the server loads with (``broker.logfile.read_log``), so the
verdict is exactly what a start would do: *clean* (exit 0), a *torn tail* that a start with
``aof-load-truncated yes`` would cut (exit 1; ``--fix`` cuts it and exits 0), or *corruption in
the middle*, which no tool should "fix" by dropping the good records behind it (exit 1 and an
explanation, with or without ``--fix``). Exit 2 for a file that is not a log we can read.
"""

from __future__ import annotations

import argparse
import os
import sys

from broker import aof
from broker.core import Broker
from node import logfile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trisque check-log",
                                     description="Verify a trisque append log.")
    parser.add_argument("file")
    parser.add_argument("--fix", action="store_true",
                        help="truncate a torn tail to the last whole record")
    args = parser.parse_args(argv)
    path: str = args.file
    try:
        size = os.path.getsize(path)
        end = logfile.scan(path, Broker.validate_record)
    except aof.LogError as exc:
        print(f"error: {exc}")
        return 2
    except OSError as exc:
        print(f"error: cannot read {path}: {exc.strerror or exc}")
        return 2
    header = end.header
    print(f"file: {path} ({size} bytes)")
    if header is not None:
        flags = " enqueue-jobs-once" if header.enqueue_once else ""
        print(f"format version: {header.version}{flags}")
    print(f"records: {end.records} (job {end.counts['job']}, ack {end.counts['ack']}, "
          f"del {end.counts['del']}, dlv {end.counts['dlv']}, qpolicy {end.counts['qpolicy']}, "
          f"timer {end.counts['timer']})")
    if end.state == "clean":
        if end.tail:
            print(f"zero-filled tail: {end.tail} bytes after the last record, at offset "
                  f"{end.offset} (preallocated by the node; cut at its next start)")
        print("status: OK")
        return 0
    lost = size - end.offset
    if end.state == "torn":
        print(f"status: torn tail at offset {end.offset}: {end.reason}; "
              f"{lost} bytes after the last whole record")
        if not args.fix:
            print("run again with --fix to truncate the file to the last whole record")
            return 1
        logfile.truncate(path, end.offset)
        print(f"fixed: truncated to {max(end.offset, aof.HEADER_SIZE)} bytes")
        return 0
    print(f"status: corrupt at offset {end.offset}: {end.reason}; "
          f"{lost} bytes from there to the end of the file")
    print("not fixable automatically: other data follows the damage, and truncating would "
          "drop records that may be whole. Keep a copy of the file; if losing everything "
          f"after offset {end.offset} is acceptable, cut it there yourself "
          f"(truncate -s {end.offset} FILE), then run --fix again.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
