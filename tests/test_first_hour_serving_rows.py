"""Per-row ``sampling_params`` of mixed shapes come back readable without Ray (issue 64, item 8): rows that set
different keys, in different batches, through BlockServeActor and ``write_parquet``, read back with plain
pyarrow, each row's own values intact."""
from __future__ import annotations

import json

import pyarrow.parquet as pq

from tests.pipeline_helpers import freeze_tiny_model

PARAMS = [{"max_tokens": 16}, {"temperature": 0.0, "seed": 3}, {"logit_bias": {"5": 1.0}}, None,
          {"max_tokens": 8, "ignore_eos": False}]


def test_mixed_sampling_params_are_one_json_column_that_plain_pyarrow_reads(ray_cluster, tmp_path):
    import ray

    from actors.ray_data.block_serve_actor import BlockServeActor

    model = freeze_tiny_model(tmp_path / "tiny")
    rows = [{"id": index, "prompt": f"count from {index} to {index + 4}",
             **({} if params is None else {"sampling_params": params})} for index, params in enumerate(PARAMS)]
    ds = ray.data.from_items(rows, override_num_blocks=len(rows))  # one shape of struct per block
    ds = ds.map_batches(BlockServeActor, batch_size=1, num_cpus=0.25, compute=ray.data.ActorPoolStrategy(size=1),
                        fn_constructor_kwargs={"model": str(model), "sampling": {"max_new_tokens": 16},
                                               "engine": {"max_batch_size": 4, "steps_per_block": 4}})
    ds.write_parquet(str(tmp_path / "out"))

    table = pq.read_table(tmp_path / "out")  # plain pyarrow: no Ray extension types, every file's rows
    assert str(table.schema.field("sampling_params").type) == "string"
    written = dict(zip(table.column("id").to_pylist(), table.column("sampling_params").to_pylist()))
    assert {index: json.loads(text) for index, text in written.items()} == {
        index: params or {} for index, params in enumerate(PARAMS)}  # {}: the row set none
    assert set(table.column("__inference_error__").to_pylist()) == {""}
