"""How the job reaches Ray: the cluster of a ``ray job submit``, or a local instance it starts."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import ray

REPO_ROOT = Path(__file__).resolve().parents[1]
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
TOKEN_AUTH_NOTICE = "Token authentication is enabled for this Ray cluster"


def without_token_auth_notice(record: logging.LogRecord) -> bool:
    """False for Ray 2.60's warning that a new local instance has token authentication, logged at every start
    while RAY_AUTH_MODE is unset. The job keeps that secure default, so the warning asks nothing of the user."""
    return not record.getMessage().startswith(TOKEN_AUTH_NOTICE)


def connect_ray() -> None:
    """Join the cluster of a ``ray job submit`` (RAY_ADDRESS), or start a local instance."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()  # a cluster the job joins keeps its own authentication
    else:  # a local instance: let its workers import this project from a plain checkout
        logging.getLogger(RAY_AUTH_LOGGER).addFilter(without_token_auth_notice)
        path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        # its workers run at this job's priority: Ray's default (nice 15) starves them beside any busy
        # process on the machine (beside two busy loops on 2 cores, an actor took 140-170 s to load the
        # tiny model, seconds otherwise); a cluster the job joins keeps its own settings
        ray.init(runtime_env={"env_vars": {"PYTHONPATH": path}}, _system_config={"worker_niceness": 0})
