"""``trisque-log``: append-log files as an events DataFrame.

Option ``path``: one log file or a directory (every ``*.aof`` file in it). One partition per
file; each is decoded by ``broker.aof.read_records`` (the broker's own reader, not a copy). A file
whose end is torn or corrupt fails the task with the file and the offset, as the broker would
refuse to load it.

One row per record: ``event`` is the record kind (``job`` for a job's full state, ``ack``,
``del``, ``flushall``, ``dlv`` for a job's first delivery), ``seq`` its position in the file.
Only ``job`` rows carry the queue and the counters. Records have no time of their own, except:
a job record has ``ctime`` (creation) and ``dtime`` (its first delivery to a consumer, null
before it and in logs written before the field existed; a node writes it into the job's
record only when that record is written for another reason), and a ``dlv`` row has the job's
``id`` and ``dtime`` (the advisory record a first delivery writes).
"""

from __future__ import annotations

import datetime as dt
import glob
import os
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from pipeline.options import OptionError

LOG_SCHEMA = (
    "file string, seq long, event string, id string, queue string, state string, "
    "ctime timestamp, retry int, nacks long, deliveries long, dtime timestamp"
)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class LogReadError(RuntimeError):
    pass


def log_files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.aof")))
        if not files:
            raise OptionError(f"option 'path': no *.aof file in directory {path}")
        return files
    if not os.path.isfile(path):
        raise OptionError(f"option 'path': no such file or directory {path}")
    return [path]


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def read_events(path: str) -> Iterator[tuple[Any, ...]]:
    from broker.aof import ReadEnd, read_records
    from broker.job import validate_record

    end = ReadEnd()
    try:
        with open(path, "rb") as f:
            for seq, (kind, data) in enumerate(read_records(f, path, end, validate_record)):
                if kind == "job":
                    (job_id, queue, _body, state, _repl, _ttl, retry, _delay, ctime, _qtime,
                     nacks, deliveries, *rest) = data
                    dtime = rest[3] if len(rest) > 3 else 0  # field 15; 15-field records lack it
                    yield (path, seq, kind, _text(job_id), _text(queue), _text(state),
                           _EPOCH + dt.timedelta(microseconds=ctime // 1000), retry, nacks,
                           deliveries,
                           _EPOCH + dt.timedelta(milliseconds=dtime) if dtime else None)
                elif kind == "dlv":
                    job_id, dtime = data
                    yield (path, seq, kind, _text(job_id), None, None, None, None, None, None,
                           _EPOCH + dt.timedelta(milliseconds=dtime))
                else:
                    yield (path, seq, kind, None if data is None else _text(data),
                           None, None, None, None, None, None, None)
    except Exception as exc:
        raise LogReadError(f"cannot read append log {path}: {exc}") from exc
    if end.state != "clean":
        raise LogReadError(f"append log {path} is {end.state} at offset {end.offset}: "
                           f"{end.reason}")


class FilePartition(InputPartition):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class LogReader(DataSourceReader):
    def __init__(self, files: list[str]) -> None:
        self.files = files

    def partitions(self) -> Sequence[InputPartition]:
        return [FilePartition(f) for f in self.files]

    def read(self, partition: FilePartition) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        yield from read_events(partition.path)


class TrisqueLogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "trisque-log"

    def schema(self) -> str:
        return LOG_SCHEMA

    def reader(self, schema: Any) -> LogReader:
        path = self.options.get("path")
        if not path:
            raise OptionError("option 'path' is required (an append-log file or its directory)")
        return LogReader(log_files(path))
