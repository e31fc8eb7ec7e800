"""``python -m actors.serving CONFIG.yaml``: Ray's ``serve run`` for a Serve config file, checked first.

    python -m actors.serving configs/serve-tiny.yaml           # http://127.0.0.1:8000; Ctrl-C stops it

Ray's ``serve run FILE`` hands the file to the Serve controller and then waits forever: a bad key fails
Serve's build task four times over, and a bad ``model`` fails each replica Serve starts. This door checks
every BlockServe application's ``args`` first (:func:`~actors.serving.serve_app.check_app_args`: the keys,
and that the model resolves, reading no weights) and exits 2 with the problem before Ray starts. It then
deploys with ``serve run --non-blocking`` and exits 1 if Serve reports the deployment failed.

A local cluster it starts keeps Ray's token authentication on (``RAY_AUTH_MODE=token`` unless set): Ray's
default too, set explicitly so that Ray does not warn about it on every start.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from ray.serve.schema import ServeDeploySchema

APP_BUILDER = "actors.serving.serve_app:build_app"
POLL_S = 2.0  # how often the deployment's status is read


class LaunchError(ValueError):
    """A config that must not be deployed; the message names the file and the key."""


def check_config_file(path: Path) -> ServeDeploySchema:
    """The file's Serve config, each BlockServe application's ``args`` checked; LaunchError otherwise."""
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    from actors.serving.serve_app import check_app_args, config_problems

    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise LaunchError(f"{path}: cannot read the Serve config: {error}") from None
    try:
        config = ServeDeploySchema.model_validate(raw)
    except ValidationError as error:
        raise LaunchError(_located(path, config_problems(error))) from None
    for index, app in enumerate(config.applications):
        if app.import_path == APP_BUILDER:
            try:
                check_app_args(app.args)
            except ValueError as error:
                raise LaunchError(_located(path, str(error), f"applications.{index}.args.")) from None
    return config


def _located(path: Path, problems: str, prefix: str = "") -> str:
    return "\n".join(f"{path}: {prefix}{line}" for line in problems.splitlines())


def deploy(path: Path, address: str | None) -> None:
    """Ray's ``serve run --non-blocking``: starts a local cluster unless ``address`` names one."""
    from ray.serve.scripts import cli

    options = ["--address", address] if address else []
    cli.main(["run", str(path), "--non-blocking", *options], standalone_mode=False)


def watch(app_names: list[str]) -> int:
    """Wait while the applications deploy and run; 1 once one of them failed to deploy, 0 on Ctrl-C or SIGTERM."""
    from ray import serve
    from ray.serve.schema import ApplicationStatus

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # a service manager's SIGTERM ends it as Ctrl-C does

    signal.signal(signal.SIGTERM, stop)
    reported = set()
    try:
        while True:
            applications = serve.status().applications
            for name in app_names:
                app = applications.get(name)
                if app is None:
                    continue
                if app.status == ApplicationStatus.DEPLOY_FAILED:
                    print(f"application {name!r} failed to deploy: {app.message}", file=sys.stderr)
                    serve.shutdown()
                    return 1
                if app.status == ApplicationStatus.RUNNING and name not in reported:
                    print(f"application {name!r} is running", flush=True)
                    reported.add(name)
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        serve.shutdown()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actors.serving", description=__doc__.split("\n")[0])
    parser.add_argument("config", type=Path, help="a Serve config file, e.g. configs/serve-tiny.yaml")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                        help="the Ray cluster to deploy to (default: RAY_ADDRESS, else a new local one)")
    options = parser.parse_args(argv)
    if options.address is None:  # before Ray is imported: it reads the mode once
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    try:
        config = check_config_file(options.config)
    except LaunchError as error:
        print(f"not deployed: {error}", file=sys.stderr)
        return 2
    deploy(options.config, options.address)
    return watch([app.name for app in config.applications])


if __name__ == "__main__":
    sys.exit(main())
