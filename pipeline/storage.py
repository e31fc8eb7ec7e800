"""Local paths and object-store URIs through one pyarrow filesystem interface.

The job's output directory may be ``runs/x`` or ``s3://bucket/run1``: Ray Data writes the Parquet
outputs either way, and the driver uses these helpers for the rest (the resume scan, stats.json,
stats.png).
"""
from __future__ import annotations

import logging
import os

import pyarrow as pa
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
