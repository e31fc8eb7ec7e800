"""The job's routing keeps rows that share a prompt prefix together inside their length bucket, so they
reach one actor in the same batches and its prefix cache stores their shared blocks once."""
from __future__ import annotations

import pyarrow as pa

from pipeline import data


def prepared_rows(ray_cluster):
    instruction = "Answer in one word, then explain the answer in a sentence or two. " * 2  # > 64 tokens
    tokenizer = data.load_tokenizer(str(data.Path(__file__).parent / "fixtures" / "tiny-sdar"))
    prompts = [f"{instruction}Q{i}: what is {i} + {i}?" if i % 2 else f"q{i}: name a colour" + "!" * (i % 5)
               for i in range(24)]
    table = pa.table({"id": [str(i) for i in range(24)], "prompt": prompts})
    table = data.add_prompt_lengths(table, str(data.Path(__file__).parent / "fixtures" / "tiny-sdar"), "prompt",
                                    chat_template=False)
    assert len(data.prompt_tokens(tokenizer, prompts[1], False)) > data.PREFIX_TOKENS
    return ray_cluster.data.from_arrow(table)


def test_rows_sharing_a_prefix_are_routed_together_and_the_others_keep_length_order(ray_cluster):
    ds = prepared_rows(ray_cluster)
    prefixes = ds.to_pandas()[data.PREFIX_COLUMN].to_numpy()
    shared = data.shared_prefixes(prefixes)
    assert len(shared) == 1 and (prefixes == shared[0]).sum() == 12  # the odd rows' instruction
    routed = data.route_by_length(ds, edges=[], batch_size=4, shared=shared).to_pandas()
    groups = routed[data.GROUP_COLUMN].tolist()
    assert groups == [0] * 12 + [shared[0]] * 12  # one bucket: the plain rows, then the instruction's
    plain = routed[data.LENGTH_COLUMN].tolist()[:12]
    assert plain == sorted(plain)
    assert all(int(i) % 2 for i in routed["id"].tolist()[12:])


def test_without_shared_prefixes_rows_are_routed_by_length_alone(ray_cluster):
    ds = prepared_rows(ray_cluster)
    routed = data.route_by_length(ds, edges=[], batch_size=4, shared=[]).to_pandas()
    assert set(routed[data.GROUP_COLUMN]) == {0}
    assert routed[data.LENGTH_COLUMN].tolist() == sorted(routed[data.LENGTH_COLUMN].tolist())
