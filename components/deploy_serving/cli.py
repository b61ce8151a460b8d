"""`ampflow deploy`: a thin shell over `run_deploy` (flags come from `DeployConfig`)."""

from __future__ import annotations

import argparse

from ampflow.cliutil import add_step_command
from ampflow.components.deploy_serving.config import DeployConfig, DeployResult
from ampflow.components.deploy_serving.step import run_deploy


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `ampflow deploy` to the top-level CLI."""
    add_step_command(
        subparsers,
        "deploy",
        config_cls=DeployConfig,
        run=run_deploy,
        summarize=DeployResult.summary,
        help="push a SavedModel (or TFLite) version to a local server, Kubernetes or KServe",
        description=(
            "Deploy one exported SavedModel version. --target local copies it atomically into "
            "<model-store>/<model_name>/<version>/, where a running `ampflow serve` or "
            "tensorflow_model_server hot-loads it. --target kubernetes checks the API server, "
            "copies the version to the model store, runs it as a canary Deployment behind the "
            "same Service (a small share of the traffic), checks its answers on the real "
            "examples export recorded, promotes it to the stable Deployment (kubectl rollout "
            "status) and records the release; a failure removes the canary and re-applies the "
            "recorded previous release. --target kserve copies the version to the model store, "
            "applies the `ampflow` ServingRuntime and an InferenceService serving the version "
            "(its new revision gets --canary-traffic-percent of the traffic), and waits until "
            "KServe reports it Ready; it prints the InferenceService's URL. --serving-format "
            "tflite (local, kserve) publishes the --tflite-variant of the convert output "
            "--tflite-dir instead, refused unless it passed its convert gate, and checks the "
            "server against the variant's own answers."
        ),
    )
