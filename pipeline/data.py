"""The stages before the engine: read, give every row an id, skip rows already done, measure prompts,
and route rows of similar prompt length together.

Routing by length
-----------------
A step costs ``rows x widest row`` (the bounding box), so an engine fed prompts of similar length
wastes little on padding. The CPU stage :func:`add_prompt_lengths` tokenizes each prompt exactly as the
engine will (chat template included) and records ``num_prompt_tokens``. Bucket edges come from the config
or, given only a count, from quantiles of the measured lengths (equal-sized buckets). Then::

    sort(length_bucket, prefix_group, num_prompt_tokens)   range partition: Ray block i = bucket i,
                                                 rows sharing a prefix together, by length inside
    repartition(target_num_rows_per_block=B)     cut into batch-sized blocks (strict), order kept

Ray Data hands whole blocks to the actor pool, so every batch an actor receives spans a narrow range of
prompt lengths (one bucket, or the seam of two neighbours), and the blocks in flight at one time come from
the same region of the length order; inside the actor, the engine's length-sorted pending queue packs the
rows of its in-flight batches tighter still. The sort is an all-to-all exchange of the (small) prompt
rows, done once before generation starts; ``bucketing.enabled: false`` skips it and streams rows in
read order.

Rows that share their first ``PREFIX_TOKENS`` tokens (a batch job's instruction, few-shot examples, a
system prompt) sort together inside their bucket (``prefix_group``), so they reach the same actor in the
same batches, where the engine's prefix cache stores their shared blocks once. Rows sharing nothing keep
the length order.
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
PREFIX_COLUMN = "prompt_prefix"  # a hash of the prompt's first PREFIX_TOKENS tokens (0: a shorter prompt)
GROUP_COLUMN = "prefix_group"  # the prefix hash when another row shares it, else 0
PREFIX_TOKENS = 64  # longer than a chat template's header, short of a shared instruction
DEFAULT_ID_COLUMN = PipelineConfig.model_fields["id_column"].default  # made from each row's content when absent


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


# -- checks before the actors start ---------------------------------------------------------------
def check_columns(config: PipelineConfig) -> None:
    """Refuse an input without the prompt column (or a chat column), or without an id column the config
    names, listing the columns it has (Ray Data reads only the first block to find them)."""
    columns = read_input(config).columns() or []
    found = ", ".join(columns) or "(none)"
    if config.prompt_column not in columns and config.messages_column not in columns:
        raise ConfigError(f"input {config.input} has no prompt column {config.prompt_column!r} (nor a "
                          f"{config.messages_column!r} column of chats); its columns: {found}. "
                          "Set prompt_column, e.g. --set prompt_column=NAME")
    if config.id_column not in columns and config.id_column != DEFAULT_ID_COLUMN:
        raise ConfigError(f"input {config.input} has no id column {config.id_column!r}; its columns: {found}. "
                          f"Set id_column to one of them, or to {DEFAULT_ID_COLUMN!r} for ids made from each "
                          "row's content")


def check_model(model: str) -> None:
    """Refuse, with the engine's own message, a model no actor could load: a bad path, a hub id that cannot
    be fetched, a checkpoint of no served family, a tokenizer that does not load. Reads no weights."""
    from engine.models.loader import check_checkpoint

    check_checkpoint(model)
    load_tokenizer(model)


# -- prompt lengths --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def load_tokenizer(model: str):
    """The model's tokenizer without its weights (a hub id fetches only the tokenizer files)."""
    from engine.models.loader import load_tokenizer as load_from_dir, resolve_model_dir

    return load_from_dir(resolve_model_dir(model, weights=False))


def prompt_tokens(tokenizer, prompt, chat_template: bool) -> list[int]:
    """The tokens the engine will see; none for a prompt it will reject (the actor reports why)."""
    from engine.models.prompts import encode_prompt

    if chat_template and isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    try:
        return list(encode_prompt(tokenizer, prompt, len(tokenizer)))
    except Exception:
        return []


def prefix_hash(tokens: list[int]) -> int:
    """A stable non-zero 63-bit hash of the first PREFIX_TOKENS tokens; 0 for a prompt no longer than that."""
    if len(tokens) <= PREFIX_TOKENS:
        return 0
    digest = hashlib.sha1(json.dumps(tokens[:PREFIX_TOKENS]).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1 or 1


def add_prompt_lengths(batch: pa.Table, model: str, prompt_column: str, chat_template: bool) -> pa.Table:
    tokenizer = load_tokenizer(model)
    prompts = (batch.column(prompt_column).to_pylist() if prompt_column in batch.column_names
               else [None] * batch.num_rows)
    tokens = [prompt_tokens(tokenizer, prompt, chat_template) for prompt in prompts]
    batch = batch.append_column(LENGTH_COLUMN, pa.array([len(t) for t in tokens], pa.int64()))
    return batch.append_column(PREFIX_COLUMN, pa.array([prefix_hash(t) for t in tokens], pa.int64()))


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


def shared_prefixes(prefixes: np.ndarray) -> list[int]:
    """The prefix hashes more than one row has."""
    values, counts = np.unique(prefixes[prefixes != 0], return_counts=True)
    return values[counts > 1].tolist()


def assign_buckets(batch: pa.Table, edges: list[int], shared: list[int] | None = None) -> pa.Table:
    lengths = batch.column(LENGTH_COLUMN).to_numpy()
    batch = batch.append_column(BUCKET_COLUMN, pa.array(np.searchsorted(edges, lengths, side="right")))
    prefixes = batch.column(PREFIX_COLUMN).to_numpy()
    groups = np.where(np.isin(prefixes, shared or []), prefixes, 0)
    return batch.append_column(GROUP_COLUMN, pa.array(groups, pa.int64()))


def route_by_length(ds: ray.data.Dataset, edges: list[int], batch_size: int,
                    shared: list[int] | None = None) -> ray.data.Dataset:
    """Rows grouped into length buckets, a shared prefix's rows together inside theirs, one batch-sized
    block at a time (see the module docstring)."""
    ds = ds.map_batches(assign_buckets, fn_kwargs={"edges": edges, "shared": shared}, batch_format="pyarrow")
    buckets = list(range(1, len(edges) + 1))  # block i holds bucket i
    ds = ds.sort([BUCKET_COLUMN, GROUP_COLUMN, LENGTH_COLUMN], boundaries=buckets or None)
    return ds.repartition(target_num_rows_per_block=batch_size, strict=True)
