"""Whether the cluster holds a pool of actors and still runs the dataset's other tasks, checked before
any actor starts.

Ray Data starts a fixed pool's actors before it hands them rows. Actors that take every CPU leave none for
the preprocess, postprocess and write tasks, so the dataset waits forever with no message. An actor larger
than every node waits too, until ``startup_timeout_s``. Both are refused here with a message that names the
setting to change, in the spelling of the door it came through (``build_processor`` or the job's YAML).
Where the autoscaler can add nodes, only the actor's size is checked, against the nodes it can add as well.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


class ClusterFitError(ValueError):
    """The cluster cannot hold the actor pool beside the dataset's other tasks; the message says what to change."""


@dataclass(frozen=True)
class Resources:
    """CPUs and GPUs: a node's, or what one actor reserves."""

    cpus: float
    gpus: float = 0.0

    def holds(self, actor: Resources) -> int:
        """How many whole actors of ``actor``'s size fit in these resources."""
        shares = [self.cpus / actor.cpus] if actor.cpus else []
        shares += [self.gpus / actor.gpus] if actor.gpus else []
        return math.floor(min(shares) + 1e-9) if shares else 0

    def describe(self) -> str:
        return f"{self.cpus:g} CPUs" + (f" and {self.gpus:g} GPUs" if self.gpus else "")


def actor_resources(num_cpus: float, num_gpus: float, ranks: int) -> Resources:
    """What one actor reserves: a CPU engine's ranks each take ``num_cpus``; a GPU actor takes
    ``num_cpus`` in all and ``num_gpus`` (one per rank)."""
    return Resources(num_cpus * (1 if num_gpus else ranks), num_gpus)


@dataclass(frozen=True)
class SettingNames:
    """How a door spells the settings a message asks the user to change."""

    num_actors: str
    num_cpus: str
    ranks: str


PROCESSOR_SETTINGS = SettingNames("concurrency", "num_cpus_per_actor", 'engine_kwargs["tensor_parallel_size"]')
JOB_SETTINGS = SettingNames("actors.num_actors", "actors.num_cpus", "engine.tensor_parallel_size")


@dataclass(frozen=True)
class ActorPool:
    """The actors a dataset starts, and the CPUs one of its other tasks needs beside them."""

    num_actors: int
    num_cpus: float  # as configured: per rank for a CPU engine
    num_gpus: float
    ranks: int
    other_task_cpus: float
    names: SettingNames

    @property
    def per_actor(self) -> Resources:
        return actor_resources(self.num_cpus, self.num_gpus, self.ranks)

    @property
    def cpus_per_setting(self) -> int:
        """How many CPUs one unit of ``num_cpus`` reserves in an actor: its ranks for a CPU engine."""
        return 1 if self.num_gpus else self.ranks


@dataclass(frozen=True)
class Cluster:
    """The alive nodes, and the node types the autoscaler can still add (none on a fixed cluster)."""

    nodes: tuple[Resources, ...]
    addable: tuple[Resources, ...] = ()

    @classmethod
    def connected(cls) -> Cluster:
        """The cluster this process's Ray is connected to."""
        import ray

        nodes = tuple(Resources(node["Resources"].get("CPU", 0.0), node["Resources"].get("GPU", 0.0))
                      for node in ray.nodes() if node.get("Alive"))
        return cls(nodes, addable_node_types())

    @property
    def cpus(self) -> float:
        return sum(node.cpus for node in self.nodes)

    def holds(self, actor: Resources) -> int:
        """Whole actors of ``actor``'s size that the alive nodes hold, each on one node."""
        return sum(node.holds(actor) for node in self.nodes)


def addable_node_types() -> tuple[Resources, ...]:
    """The node types of the autoscaler's config that can scale up, as Ray Data's own autoscaler reads them."""
    import ray._private.state

    config = ray._private.state.state.get_cluster_config()
    if config is None:
        return ()
    return tuple(Resources(group.resources.get("CPU", 0.0), group.resources.get("GPU", 0.0))
                 for group in config.node_group_configs
                 if group.max_count != 0 and (group.max_count == -1 or group.max_count > group.min_count))


def round_down(value: float) -> float:
    """``value`` rounded down to hundredths, so that a suggested setting fits."""
    return math.floor(value * 100 + 1e-9) / 100


def fit_problem(pool: ActorPool, cluster: Cluster) -> str | None:
    """Why ``cluster`` cannot run ``pool`` beside one of the dataset's other tasks, or None when it can."""
    actor, names = pool.per_actor, pool.names
    if not any(node.holds(actor) for node in cluster.nodes + cluster.addable):
        return too_large_for_any_node(pool, cluster.nodes + cluster.addable)
    if cluster.addable:
        return None  # the autoscaler adds the nodes a larger pool needs
    held = cluster.holds(actor)
    if held < pool.num_actors:
        gpus_short = bool(actor.gpus) and cluster.holds(Resources(0.0, actor.gpus)) < pool.num_actors
        return (f"the cluster's nodes hold {held} actor(s) of {actor.describe()}, not the {pool.num_actors} "
                f"asked for ({names.num_actors}); Ray would wait for the rest forever. Set {names.num_actors} "
                f"to at most {held}" + (", or add GPU nodes" if gpus_short else f", or lower {names.num_cpus}"))
    left = cluster.cpus - pool.num_actors * actor.cpus
    if left + 1e-9 >= pool.other_task_cpus:
        return None
    room = cluster.cpus - pool.other_task_cpus  # what the actors may take in all
    changes, num_cpus_that_fit = [], round_down(room / pool.num_actors / pool.cpus_per_setting)
    if num_cpus_that_fit > 0:
        changes.append(f"set {names.num_cpus} to at most {num_cpus_that_fit:g}")
    if room >= actor.cpus:
        changes.append(f"set {names.num_actors} to at most {math.floor(room / actor.cpus + 1e-9)}")
    if pool.cpus_per_setting > 1:
        changes.append(f"lower {names.ranks}")
    advice = ", or ".join(changes + ["add CPUs to the cluster"])
    per_rank = f" ({pool.ranks} ranks of {pool.num_cpus:g})" if pool.cpus_per_setting > 1 else ""
    return (f"{pool.num_actors} actor(s) of {actor.cpus:g} CPUs{per_rank} take {pool.num_actors * actor.cpus:g} of "
            f"the cluster's {cluster.cpus:g} CPUs and leave {max(left, 0):g}, less than the {pool.other_task_cpus:g} "
            f"that one of the dataset's other tasks (preprocess, postprocess, write) asks for; the dataset would "
            f"never start. "
            f"{advice[:1].upper()}{advice[1:]}")


def too_large_for_any_node(pool: ActorPool, nodes: tuple[Resources, ...]) -> str:
    actor, names = pool.per_actor, pool.names
    most_gpus = max((node.gpus for node in nodes), default=0.0)
    if actor.gpus > most_gpus:
        return (f"an actor asks for {actor.gpus:g} GPUs (one per rank, {names.ranks}) but no node has more than "
                f"{most_gpus:g}; Ray would wait for one forever. Lower {names.ranks}, or add GPU nodes")
    most_cpus = max(node.cpus for node in nodes if node.gpus >= actor.gpus)
    per_rank = (f" ({pool.ranks} ranks of {pool.num_cpus:g}: a CPU engine reserves {names.num_cpus} per rank)"
                if pool.cpus_per_setting > 1 else "")
    return (f"an actor asks for {actor.cpus:g} CPUs{per_rank} but no node has more than {most_cpus:g}; Ray would "
            f"wait for one forever. Set {names.num_cpus} to at most {round_down(most_cpus / pool.cpus_per_setting):g}"
            + (f", or lower {names.ranks}" if pool.cpus_per_setting > 1 else ""))


def check_fit(pool: ActorPool, cluster: Cluster | None = None) -> None:
    """Raise :class:`ClusterFitError` when the cluster (by default the connected one) cannot run ``pool``."""
    problem = fit_problem(pool, cluster or Cluster.connected())
    if problem:
        raise ClusterFitError(problem)
