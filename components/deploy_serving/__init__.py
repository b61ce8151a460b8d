"""The deploy step: a SavedModel version to a local server, TF Serving on Kubernetes or KServe."""

from ampflow.components.deploy_serving.config import DeployConfig, DeployResult
from ampflow.components.deploy_serving.step import run_deploy

__all__ = ["DeployConfig", "DeployResult", "run_deploy"]
