"""A new user's first hour with ``build_processor``: a pool of actors the cluster cannot hold fails
before any actor starts, with a message that says what to change."""
from __future__ import annotations

import pytest

from actors.ray_data.cluster_fit import Cluster, ClusterFitError, Resources, fit_problem
from tests.pipeline_helpers import demo_rows

TWO_CPUS = Cluster((Resources(cpus=2.0),))


def readme_processor_config(**settings):
    """The README's ``build_processor`` line, with ``settings`` added."""
    from actors import BlockServeProcessorConfig

    engine_kwargs = {"max_batch_size": 16, **settings.pop("engine_kwargs", {})}
    return BlockServeProcessorConfig(**{"model_source": "tiny", "engine_kwargs": engine_kwargs, "concurrency": 2,
                                        "batch_size": 16, **settings})


def readme_pool(**settings):
    from actors.ray_data.processor import TASK_CPUS

    return readme_processor_config(**settings).actor_pool(TASK_CPUS)


# -- the cluster holds the actors, or the message says what to change --------------------------------
def test_readme_build_processor_line_leaves_a_cpu_free_on_two_cpus():
    assert fit_problem(readme_pool(), TWO_CPUS) is None


def test_actors_that_take_every_cpu_are_refused_naming_concurrency_and_num_cpus_per_actor():
    problem = fit_problem(readme_pool(num_cpus_per_actor=1.0), TWO_CPUS)
    assert problem.startswith("2 actor(s) of 1 CPUs take 2 of the cluster's 2 CPUs and leave 0")
    assert "Set num_cpus_per_actor to at most 0.5, or set concurrency to at most 1" in problem


def test_a_cpu_engine_split_in_two_reserves_a_cpu_share_per_rank_and_is_refused_by_name():
    problem = fit_problem(readme_pool(engine_kwargs={"tensor_parallel_size": 2}), TWO_CPUS)
    assert "2 actor(s) of 1 CPUs (2 ranks of 0.5) take 2 of the cluster's 2 CPUs" in problem
    assert "Set num_cpus_per_actor to at most 0.25, or set concurrency to at most 1" in problem
    assert 'lower engine_kwargs["tensor_parallel_size"]' in problem


def test_a_processor_that_cannot_start_raises_when_applied_before_any_actor_starts(ray_cluster):
    from ray.data.llm import build_processor

    config = readme_processor_config(concurrency=4, num_cpus_per_actor=1.0)  # the session cluster's 4 CPUs
    processor = build_processor(config, preprocess=lambda row: {"prompt": row["prompt"]})
    dataset = ray_cluster.data.from_items(demo_rows(4))
    with pytest.raises(ClusterFitError, match="take 4 of the cluster's 4 CPUs and leave 0, less than the 1"):
        processor(dataset)  # lazy: the dataset has not run, so no actor was created
