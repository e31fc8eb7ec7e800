"""Local paths and object-store URIs through one pyarrow filesystem interface.

The job's output directory may be ``runs/x`` or ``s3://bucket/run1``: Ray Data writes the Parquet
outputs either way, and the driver uses these helpers for the rest (the resume scan, stats.json,
stats.png).
"""
from __future__ import annotations

import logging
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

logger = logging.getLogger(__name__)


def is_uri(location: str) -> bool:
    return "://" in location


def resolve(location: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or a URI."""
    if is_uri(location):
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), os.path.abspath(location)


def absolute(location: str) -> str:
    """A URI as it is; a local path made absolute (Ray's workers do not share the driver's cwd)."""
    return location if is_uri(location) else os.path.abspath(location)


def join(location: str, *parts: str) -> str:
    return "/".join([location.rstrip("/"), *parts])


def list_files(location: str, suffix: str = "") -> list[str]:
    """Files under ``location`` (recursively) ending with ``suffix``, as paths inside its filesystem."""
    fs, path = resolve(location)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    selector = pafs.FileSelector(path, recursive=True)
    return sorted(info.path for info in fs.get_file_info(selector)
                  if info.type == pafs.FileType.File and info.path.endswith(suffix))


def is_dir(location: str) -> bool:
    fs, path = resolve(location)
    return fs.get_file_info(path).type == pafs.FileType.Directory


def delete_dir(location: str) -> None:
    fs, path = resolve(location)
    if fs.get_file_info(path).type == pafs.FileType.Directory:
        fs.delete_dir(path)


def write_bytes(location: str, data: bytes) -> None:
    fs, path = resolve(location)
    parent = path.rsplit("/", 1)[0]
    if parent:
        fs.create_dir(parent, recursive=True)
    with fs.open_output_stream(path) as stream:
        stream.write(data)


def read_column(location: str, column: str) -> pa.ChunkedArray:
    """``column`` of every Parquet file under ``location``. A file that cannot be read (a write cut off
    by a crash) is deleted, so its rows count as not done and are generated again."""
    fs, _ = resolve(location)
    chunks: list[pa.Array] = []
    for path in list_files(location, ".parquet"):
        try:
            table = pq.read_table(path, columns=[column], filesystem=fs)
        except (pa.ArrowInvalid, OSError) as error:
            logger.warning("deleting unreadable output file %s (%s); its rows will be redone", path, error)
            fs.delete_file(path)
            continue
        chunks.extend(table.column(column).cast(pa.string()).chunks)
    return pa.chunked_array(chunks, type=pa.string())


def drop_rows_with_value(location: str, column: str) -> int:
    """Remove from every Parquet file under ``location`` the rows whose ``column`` is non-empty; returns
    how many. A file is replaced by its kept rows through a temporary name that no reader lists, and the
    old file goes first: a crash leaves the old rows or the new ones (or neither, and those rows are
    redone), never both."""
    fs, _ = resolve(location)
    dropped = 0
    for path in list_files(location, ".parquet"):
        try:
            if column not in pq.read_schema(path, filesystem=fs).names:
                continue
            table = pq.read_table(path, filesystem=fs)
        except (pa.ArrowInvalid, OSError):
            continue  # a write cut off by a crash: read_column deletes it
        values = table.column(column)
        has_value = pc.and_kleene(pc.is_valid(values), pc.not_equal(values, ""))  # a null is no value
        count = pc.sum(has_value).as_py() or 0
        if count == 0:
            continue
        kept = table.filter(pc.invert(has_value))
        if kept.num_rows:
            pq.write_table(kept, f"{path}.rewriting", filesystem=fs)
        fs.delete_file(path)
        if kept.num_rows:
            fs.move(f"{path}.rewriting", path)
        dropped += count
    return dropped
