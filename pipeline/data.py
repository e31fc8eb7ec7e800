"""The stages before the engine: read, give every row an id, skip rows already done, measure prompts,
and route rows of similar prompt length together.

Routing by length
-----------------
A step costs ``rows x widest row`` (the bounding box), so an engine fed prompts of similar length
wastes little on padding. The CPU stage :func:`add_prompt_lengths` tokenizes each prompt exactly as the
engine will (chat template included) and records ``num_prompt_tokens``. Bucket edges come from the config
or, given only a count, from quantiles of the measured lengths (equal-sized buckets). Then::

    sort(num_prompt_tokens, boundaries=edges)   range partition: Ray block i = bucket i, rows
                                                 sorted by length inside it
    repartition(target_num_rows_per_block=B)     cut into batch-sized blocks (strict), order kept

Ray Data hands whole blocks to the actor pool, so every batch an actor receives spans a narrow range of
prompt lengths (one bucket, or the seam of two neighbours), and the blocks in flight at one time come from
the same region of the length order; inside the actor, the engine's length-sorted pending queue packs the
rows of its in-flight batches tighter still. The sort is an all-to-all exchange of the (small) prompt
rows, done once before generation starts; ``bucketing.enabled: false`` skips it and streams rows in
read order.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from pipeline import storage
from pipeline.config import ConfigError, PipelineConfig

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".csv": "csv"}
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".zst", ".lz4", ".br")
LENGTH_COLUMN = "num_prompt_tokens"
BUCKET_COLUMN = "length_bucket"


# -- reading ---------------------------------------------------------------------------------------
def detect_format(location: str) -> str:
    """jsonl / parquet / csv from the file name (or the first file of a directory)."""
    name = location
    if storage.is_dir(location):
        files = [f for f in storage.list_files(location) if not Path(f).name.startswith((".", "_"))]
        name = files[0] if files else location
    for suffix in COMPRESSION_SUFFIXES:
        name = name.removesuffix(suffix)
    found = FORMATS.get(Path(name).suffix.lower())
    if found is None:
        raise ConfigError(f"cannot tell the format of input {location!r}; set input_format")
    return found


def read_input(config: PipelineConfig) -> ray.data.Dataset:
    location = storage.absolute(config.input)
    fmt = detect_format(location) if config.input_format == "auto" else config.input_format
    if fmt == "parquet":
        ds = ray.data.read_parquet(location)
    elif fmt == "csv":
        ds = ray.data.read_csv(location)
    else:
        ds = ray.data.read_json(location, lines=True)
    return ds.limit(config.limit) if config.limit is not None else ds


# -- ids and resume --------------------------------------------------------------------------------
def add_ids(batch: pa.Table, id_column: str) -> pa.Table:
    """Rows without an ``id_column`` get a deterministic id: a hash of the row's content (identical rows
    share an id, so inputs with exact duplicate rows should bring their own id column)."""
    if id_column in batch.column_names:
        return batch
    ids = [hashlib.sha1(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()[:20]
           for row in batch.to_pylist()]
    return batch.append_column(id_column, pa.array(ids, pa.string()))


def drop_done(batch: pa.Table, id_column: str, done_ids: pa.Array) -> pa.Table:
    done = pc.is_in(pc.cast(batch.column(id_column), pa.string()), value_set=done_ids)
    return batch.filter(pc.invert(done))


def with_ids_not_done(ds: ray.data.Dataset, id_column: str, done_ids: pa.ChunkedArray) -> ray.data.Dataset:
    """Every row with an id (checked per batch: no schema probe of the input), minus those done."""
    ds = ds.map_batches(add_ids, batch_format="pyarrow", fn_kwargs={"id_column": id_column})
    if len(done_ids) == 0:
        return ds
    return ds.map_batches(drop_done, batch_format="pyarrow",
                          fn_kwargs={"id_column": id_column, "done_ids": done_ids.combine_chunks()})


# -- prompt lengths --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def load_tokenizer(model: str):
    """The model's tokenizer without its weights (a hub id fetches only the tokenizer files)."""
    from engine.models.loader import TINY_MODEL_DIR, load_tokenizer as load_from_dir

    directory = TINY_MODEL_DIR if model == "tiny" else Path(model).expanduser()
    if not directory.is_dir():
        from huggingface_hub import snapshot_download

        directory = Path(snapshot_download(model, allow_patterns=["*.json", "*.jinja", "*.model", "*.txt"]))
    return load_from_dir(directory)


def prompt_length(tokenizer, prompt, chat_template: bool) -> int:
    """Tokens the engine will see; 0 for a prompt it will reject (the actor reports why)."""
    from engine.models.prompts import encode_prompt

    if chat_template and isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    try:
        return len(encode_prompt(tokenizer, prompt, len(tokenizer)))
    except Exception:
        return 0


def add_prompt_lengths(batch: pa.Table, model: str, prompt_column: str, chat_template: bool) -> pa.Table:
    tokenizer = load_tokenizer(model)
    prompts = (batch.column(prompt_column).to_pylist() if prompt_column in batch.column_names
               else [None] * batch.num_rows)
    lengths = [prompt_length(tokenizer, prompt, chat_template) for prompt in prompts]
    return batch.append_column(LENGTH_COLUMN, pa.array(lengths, pa.int64()))


def measure_prompts(ds: ray.data.Dataset, config: PipelineConfig) -> ray.data.Dataset:
    return ds.map_batches(
        add_prompt_lengths, batch_format="pyarrow", num_cpus=0.5,
        fn_kwargs={"model": config.model, "prompt_column": config.prompt_column,
                   "chat_template": config.chat_template})


# -- bucketing and routing -------------------------------------------------------------------------
def quantile_edges(lengths: np.ndarray, num_buckets: int) -> list[int]:
    """Edges splitting ``lengths`` into ``num_buckets`` groups of about equal size (fewer if lengths
    repeat): bucket i holds lengths in [edges[i-1], edges[i])."""
    if len(lengths) == 0 or num_buckets <= 1:
        return []
    quantiles = np.quantile(lengths, np.linspace(0, 1, num_buckets + 1)[1:-1], method="higher")
    return sorted({int(q) for q in quantiles if q > lengths.min()})


def assign_buckets(batch: pa.Table, edges: list[int]) -> pa.Table:
    lengths = batch.column(LENGTH_COLUMN).to_numpy()
    return batch.append_column(BUCKET_COLUMN, pa.array(np.searchsorted(edges, lengths, side="right")))


def route_by_length(ds: ray.data.Dataset, edges: list[int], batch_size: int) -> ray.data.Dataset:
    """Rows grouped into length buckets, one batch-sized block at a time (see the module docstring)."""
    ds = ds.map_batches(assign_buckets, fn_kwargs={"edges": edges}, batch_format="pyarrow")
    ds = ds.sort(LENGTH_COLUMN, boundaries=edges or None)
    return ds.repartition(target_num_rows_per_block=batch_size, strict=True)
