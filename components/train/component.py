"""KFP component: train. A thin wrapper: artifact paths in, `run_train` out."""

from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from ampflow.components.train.config import TrainConfig
from ampflow.kfp_args import document_args


def train(
    data: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    architecture: str = "small_cnn",
    precision: str = "auto",
    xla: str = "auto",
    epochs: int = 8,
    batch_size: int = 32,
    accumulation_steps: int = 1,
    learning_rate: float = 0.0,
    seed: int = 42,
    checkpoint_dir: str = "",
    autotune: bool = False,
    workers: int = 1,
    scale_learning_rate: bool = False,
    tfjob_settings: str = "",
    run_key: str = "",
    batch_size_multiplier: int = 1,
    model_path: str = "",
    packed_allreduce: bool = True,
    allreduce_bytes_per_pack: int = 0,
    allreduce_dtype: str = "float32",
    max_sequence_length: int = 128,
    vocabulary_size: int = 20000,
    weights: str = "",
    head_epochs: int = 5,
    head_learning_rate: float = 0.001,
    base_model: Input[Model] = None,
    weights_file: Input[Artifact] = None,
):
    """Train with mixed precision; publish the model and its training metrics.

    `model` is the model dir (model.keras; a text model's tokenizer, vocab.txt and
    tokenizer.json, beside it). The defaults are spelt out because KFP copies this function's
    source into its task; tests/pipeline/test_train_defaults.py ties each to the train step's
    own (TrainConfig), whose fields' help is also the Args KFP shows.
    """
    import os

    from ampflow.artifacts.throughput import throughput_unit
    from ampflow.components.train import TrainConfig, run_train
    from ampflow.errors import ConfigError

    jit = {"auto": None, "on": True, "off": False, "true": True, "false": False}.get(
        xla.lower(), "bad")
    if jit == "bad":
        raise ConfigError(f"xla must be auto, on or off. Received: {xla!r}")
    if checkpoint_dir and "://" not in checkpoint_dir:  # a volume KFP mounts without fsGroup
        from ampflow.files import check_volume_writable

        check_volume_writable(checkpoint_dir,
                              f"the checkpoint dir {checkpoint_dir} (the run's KFP workspace)")
    if base_model is not None:  # downloaded by KFP's launcher (the local runner: a local path)
        from ampflow.modeling.base_model import model_argument

        architecture = model_argument(base_model.path)
    if weights_file is not None:  # an imported ImageNet weights file, in place of the path
        if weights:
            raise ConfigError("weights and the imported weights_file both name the ImageNet "
                              "weights to load: pass one. Received: weights="
                              f"{weights!r}, weights_file={weights_file.uri!r}")
        weights = weights_file.path
    config = TrainConfig(
        data_dir=data.path, output_dir=model.path, model=architecture,
        model_path=model_path or None, precision=precision,
        jit_compile=jit, epochs=epochs, batch_size=batch_size * batch_size_multiplier,
        accumulation_steps=accumulation_steps,
        learning_rate=learning_rate or None,
        seed=seed, checkpoint_dir=checkpoint_dir or None, autotune=autotune, workers=workers,
        scale_learning_rate=scale_learning_rate, packed_allreduce=packed_allreduce,
        allreduce_bytes_per_pack=allreduce_bytes_per_pack, allreduce_dtype=allreduce_dtype,
        max_sequence_length=max_sequence_length, vocabulary_size=vocabulary_size,
        weights=weights or None, head_epochs=head_epochs,
        head_learning_rate=head_learning_rate)
    if workers > 1 and tfjob_settings and os.environ.get("KUBERNETES_SERVICE_HOST"):
        from ampflow.components.train.clusters.kubeflow_job import TFJobSettings, run_training_job

        result = run_training_job(config, TFJobSettings.from_json(tfjob_settings), run_key)
    else:
        result = run_train(config)
    meta = result.metadata
    model.metadata.update({"framework": "keras", "policy": meta["precision"]["policy"],
                           "xla": meta["xla"]["effective"], "architecture": meta["architecture"],
                           "model_kind": meta["model"]["kind"],
                           "modality": meta.get("modality", "image"),
                           "workers": meta.get("distribution", {}).get("num_workers", 1)})
    final = meta["final_metrics"]
    for key in ("accuracy", "val_accuracy", "loss", "val_loss"):
        if key in final:
            metrics.log_metric(key, float(final[key]))
    metrics.log_metric(throughput_unit(meta.get("modality")).metric,  # texts: _texts_per_s
                       float(meta["throughput_examples_per_sec"] or 0))
    metrics.log_metric("train_seconds", float(meta["train_seconds"]))
    if meta["loss_scale"].get("enabled"):
        metrics.log_metric("loss_scale_final", float(meta["loss_scale"]["final"]))
        metrics.log_metric("skipped_steps", float(meta["loss_scale"]["skipped_steps"]))


_SET_AT_COMPILE_TIME = "Set at compile time (PipelineOptions)"
document_args(train, TrainConfig, renamed={"architecture": "model", "xla": "jit_compile"}, notes={
    "xla": 'auto, on or off (KFP has no optional booleans); "true" and "false", the old '
           "spelling, are still read",
    "batch_size": "A number here ('auto' is the command line's: KFP's parameter is an int)",
    "accumulation_steps": "The float32 baseline takes the same steps, so both see the same "
                          "effective batch",
    "learning_rate": "0: the model's own (KFP has no optional floats)",
    "checkpoint_dir": "Empty: inside the output artifact, which a retried pod does not get back",
    "weights": "Empty: none (the model's random initialization). A path where the train task "
               "runs (in the image, or on a volume mounted there); the float32 baseline takes "
               "the same file",
    "packed_allreduce": _SET_AT_COMPILE_TIME,
    "allreduce_bytes_per_pack": _SET_AT_COMPILE_TIME,
    "allreduce_dtype": _SET_AT_COMPILE_TIME,
}, own={
    "data": "The prepared dataset (prepare-data's output).",
    "workers": "More than 1 trains on that many workers: inside a cluster as a TFJob described "
               "by tfjob_settings; elsewhere (the local runner) as local processes with "
               "TF_CONFIG.",
    "tfjob_settings": "The TFJob that runs workers > 1 inside a cluster, as JSON (set at "
                      "compile time).",
    "run_key": "Names the TFJob, so that a retried task finds its job.",
    "batch_size_multiplier": "Trains one process at this many times batch_size: the float32 "
                             "baseline of an N-worker AMP task gets N, so both see the same "
                             "global batch and steps and differ only in precision.",
    "base_model": "A .keras file, a model dir holding model.keras (a text model with its "
                  "tokenizer beside it) or a pretrained BERT checkpoint dir (Hugging Face's "
                  "layout or a keras-hub preset), brought in by a dsl.importer and fine-tuned "
                  "instead of `architecture`.",
    "weights_file": "A Keras applications ImageNet weights file (..._notop.h5) for "
                    "resnet50's or mobilenet_v2's backbone, brought in by a dsl.importer "
                    "(--weights-uri): used as `weights`, which must then be empty.",
})
