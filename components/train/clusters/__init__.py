"""Processes and clusters: existing engines only.

TF_CONFIG read and the strategy chosen (`tf_config.py`), the local launcher that starts workers
with the engine's contract (`launcher.py`), and the Kubeflow TFJob / Trainer v2 TrainJob
manifests (`kubeflow_job.py`).
"""
