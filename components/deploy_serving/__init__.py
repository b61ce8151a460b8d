"""The deploy step: a SavedModel version to a local model server or to TF Serving on Kubernetes."""

from ampflow.components.deploy_serving.config import DeployConfig, DeployResult
from ampflow.components.deploy_serving.step import run_deploy

__all__ = ["DeployConfig", "DeployResult", "run_deploy"]
