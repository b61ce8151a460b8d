"""The ampflow KFP pipeline: data → AMP + float32 training → parity gate → export → TFLite → deploy.

This file only wires tasks; every step's logic lives in `components/<step>/step.py` and each
component is a thin wrapper over it (`components/<step>/component.py`). What depends on the
cluster is a compile-time `PipelineOptions` (options.py; tasks.py applies it to each task);
what a user changes per run is a pipeline parameter. How it behaves on a KFP backend, and why
it is wired this way: docs/explanation/kfp-backend.md.
"""


from ampflow.cliutil import TRISTATE
from ampflow.components.convert_tflite.config import ConvertConfig
from ampflow.components.deploy_serving.config import MODEL_STORE_MOUNT, OVERLAYS, DeployConfig
from ampflow.components.evaluate_parity.config import EvaluateConfig
from ampflow.components.prepare_data.config import PrepareDataConfig
from ampflow.components.train.config import TrainConfig
from ampflow.kfp_args import document_args

# The compile-time settings live in options.py; their importers keep finding them here too.
from ampflow.pipeline.options import PipelineOptions, cli_fields, options_from  # noqa: F401
from ampflow.pipeline.settings import as_component
from ampflow.pipeline.tasks import (
    configure_train_task,
    label_serving_client,
    mount_model_store,
    set_resources,
    setters_without_a_stack_walk,
)

PIPELINE_NAME = "ampflow"
# Where each train task keeps its resumable state on the run's workspace (one dir per task).
AMP_CHECKPOINTS = "checkpoints/train-amp"
FLOAT32_CHECKPOINTS = "checkpoints/train-float32"
# The parity gate's thresholds as pipeline parameters: the evaluate step's own defaults
# (EvaluateConfig, where their reasons are written). A parameter is a float, so the auto bound
# of the relative logit check (None there) is any value < 0 here.
AUTO_RELATIVE_LOGIT_DIFF = -1.0
GATE_DEFAULTS = {name: EvaluateConfig.__dataclass_fields__[name].default for name in (
    "max_accuracy_drop", "min_agreement", "max_baseline_accuracy_drop", "baseline_alpha",
    "chance_alpha", "min_accuracy", "metric_thresholds", "serving_alpha", "serving_rule",
    "non_inferiority_margin", "max_detectable_drop", "force")}
# The training parameters' defaults: the train step's own (TrainConfig), read by the pipeline's
# signature, its parameter table (parameters.py), run-local/demo and tied to the KFP component's
# spelt-out defaults by tests/pipeline/test_train_defaults.py. XLA is `auto|on|off` everywhere
# (TrainConfig's None is auto); `model` is train's --model (the architecture).
XLA_VALUES = tuple(TRISTATE)
# TrainConfig's learning_rate None (the model's own) is 0 here: a KFP parameter has no None.
MODEL_LEARNING_RATE = 0.0
# The data and TFLite parameters' defaults: prepare-data's and convert's own.
DATA_DEFAULTS = {
    "dataset": PrepareDataConfig.__dataclass_fields__["dataset"].default,
    "test_fraction": PrepareDataConfig.__dataclass_fields__["test_fraction"].default,
    "tflite_variants": ",".join(ConvertConfig.__dataclass_fields__["variants"].default),
}
# The text parameters' defaults: prepare-data's own (PrepareDataConfig: the text source and
# how it is read) and train's (TrainConfig, which takes them from TokenizerConfig). A path or
# name that is None there (not given) is "" here: a KFP parameter has no None.
_DATA_FIELDS = PrepareDataConfig.__dataclass_fields__
TEXT_DATA_PARAMETERS = ("text_folder", "text_file", "text_column", "label_column",
                        "text_feature", "max_text_bytes")
TEXT_TRAIN_PARAMETERS = ("max_sequence_length", "vocabulary_size")
TEXT_DEFAULTS = {
    **{name: "" if _DATA_FIELDS[name].default is None else _DATA_FIELDS[name].default
       for name in TEXT_DATA_PARAMETERS},
    **{name: TrainConfig.__dataclass_fields__[name].default for name in TEXT_TRAIN_PARAMETERS},
}
# The k8s overlay the deploy step renders (a run-time parameter): the deploy step's own default.
SERVING_OVERLAYS = OVERLAYS
DEFAULT_SERVING_OVERLAY = DeployConfig.__dataclass_fields__["overlay"].default
# What the deploy step publishes (the SavedModel, or one TFLite variant): its own defaults.
SERVING_DEFAULTS = {name: DeployConfig.__dataclass_fields__[name].default
                    for name in ("serving_format", "tflite_variant", "compute_precision")}
_TRAIN_FIELDS = TrainConfig.__dataclass_fields__
TRAIN_DEFAULTS = {
    **{name: _TRAIN_FIELDS[name].default for name in (
        "model", "epochs", "batch_size", "accumulation_steps", "precision", "seed")},
    "learning_rate": _TRAIN_FIELDS["learning_rate"].default or MODEL_LEARNING_RATE,
    **{name: _TRAIN_FIELDS[name].default for name in ("head_epochs", "head_learning_rate")},
    "weights": _TRAIN_FIELDS["weights"].default or "",  # None (no file) is "" here
    "xla": next(word for word, value in TRISTATE.items()
                if value is _TRAIN_FIELDS["jit_compile"].default),
}

# The pipeline parameters named otherwise than the component input they set (for their help).
PARAMETER_INPUTS = {"model": "architecture", "tflite_variants": "variants",
                    "serving_target": "target", "serving_model_store": "model_store",
                    "serving_address": "server_address", "serving_overlay": "overlay",
                    "serving_compute_precision": "compute_precision"}


def build_pipeline(options: PipelineOptions | None = None):
    """Return the `@dsl.pipeline` function for `options` (compile it or run it locally)."""
    from kfp import dsl

    from ampflow.components.convert_tflite.component import convert_tflite
    from ampflow.components.deploy_serving.component import deploy_serving
    from ampflow.components.evaluate_parity.component import (
        compare_serving,
        evaluate_parity,
        parity_gate,
        serving_gate,
    )
    from ampflow.components.export_savedmodel.component import export_savedmodel
    from ampflow.components.prepare_data.component import prepare_data
    from ampflow.components.pretrain.component import pretrain
    from ampflow.components.train.component import train
    from ampflow.pipeline.distributed_task import (
        configure_train_workers_task,
        train_workers_arguments,
    )

    setters_without_a_stack_walk()
    options = options or PipelineOptions()
    ops = {f.__name__: as_component(f, options.image) for f in (
        prepare_data, pretrain, train, evaluate_parity, parity_gate, export_savedmodel,
        convert_tflite, compare_serving, serving_gate, deploy_serving)}

    def ampflow_pipeline(
        dataset: str = DATA_DEFAULTS["dataset"],
        test_fraction: float = DATA_DEFAULTS["test_fraction"],
        model: str = TRAIN_DEFAULTS["model"],
        epochs: int = TRAIN_DEFAULTS["epochs"],
        batch_size: int = TRAIN_DEFAULTS["batch_size"],
        accumulation_steps: int = TRAIN_DEFAULTS["accumulation_steps"],
        learning_rate: float = TRAIN_DEFAULTS["learning_rate"],
        precision: str = TRAIN_DEFAULTS["precision"],
        xla: str = TRAIN_DEFAULTS["xla"],
        seed: int = TRAIN_DEFAULTS["seed"],
        autotune: bool = False,
        max_accuracy_drop: float = GATE_DEFAULTS["max_accuracy_drop"],
        min_agreement: float = GATE_DEFAULTS["min_agreement"],
        max_relative_logit_diff: float = AUTO_RELATIVE_LOGIT_DIFF,
        max_baseline_accuracy_drop: float = GATE_DEFAULTS["max_baseline_accuracy_drop"],
        baseline_alpha: float = GATE_DEFAULTS["baseline_alpha"],
        chance_alpha: float = GATE_DEFAULTS["chance_alpha"],
        min_accuracy: float = GATE_DEFAULTS["min_accuracy"],
        metric_thresholds: str = GATE_DEFAULTS["metric_thresholds"],
        serving_alpha: float = GATE_DEFAULTS["serving_alpha"],
        serving_rule: str = GATE_DEFAULTS["serving_rule"],
        non_inferiority_margin: float = GATE_DEFAULTS["non_inferiority_margin"],
        max_detectable_drop: float = GATE_DEFAULTS["max_detectable_drop"],
        force: bool = GATE_DEFAULTS["force"],
        tflite_variants: str = DATA_DEFAULTS["tflite_variants"],
        model_name: str = "ampflow",
        serving_target: str = "none",
        serving_model_store: str = MODEL_STORE_MOUNT,
        serving_address: str = "",
        serving_overlay: str = DEFAULT_SERVING_OVERLAY,
        serving_format: str = SERVING_DEFAULTS["serving_format"],
        tflite_variant: str = SERVING_DEFAULTS["tflite_variant"],
        serving_compute_precision: str = SERVING_DEFAULTS["compute_precision"],
        model_path: str = "",
        weights: str = TRAIN_DEFAULTS["weights"],
        head_epochs: int = TRAIN_DEFAULTS["head_epochs"],
        head_learning_rate: float = TRAIN_DEFAULTS["head_learning_rate"],
        image_size: str = "",
        image_folder: str = "",
        text_folder: str = TEXT_DEFAULTS["text_folder"],
        text_file: str = TEXT_DEFAULTS["text_file"],
        text_column: str = TEXT_DEFAULTS["text_column"],
        label_column: str = TEXT_DEFAULTS["label_column"],
        text_feature: str = TEXT_DEFAULTS["text_feature"],
        max_text_bytes: int = TEXT_DEFAULTS["max_text_bytes"],
        max_sequence_length: int = TEXT_DEFAULTS["max_sequence_length"],
        vocabulary_size: int = TEXT_DEFAULTS["vocabulary_size"],
    ):
        data = ops["prepare_data"](dataset=dataset, test_fraction=test_fraction,
                                   image_size=image_size,
                                   image_folder=image_folder, text_folder=text_folder,
                                   text_file=text_file, text_column=text_column,
                                   label_column=label_column, text_feature=text_feature,
                                   max_text_bytes=max_text_bytes)
        data.set_caching_options(options.cache_data)
        set_resources(data, options.default_resources)

        train_args = dict(data=data.outputs["data"], architecture=model, epochs=epochs,
                          batch_size=batch_size, accumulation_steps=accumulation_steps,
                          learning_rate=learning_rate,
                          xla=xla, seed=seed, model_path=model_path, weights=weights,
                          head_epochs=head_epochs, head_learning_rate=head_learning_rate,
                          max_sequence_length=max_sequence_length,
                          vocabulary_size=vocabulary_size)
        if options.base_model_uri:
            base = dsl.importer(artifact_uri=options.base_model_uri, artifact_class=dsl.Model,
                                reimport=False)
            base.set_display_name("base-model")
            train_args["base_model"] = base.output
        elif options.pretrain_epochs:
            # the encoder's position table is the length train fine-tunes at; the rest of its
            # settings are the pretrain step's defaults (PipelineOptions.pretrain_epochs)
            encoder = ops["pretrain"](data=data.outputs["data"], epochs=options.pretrain_epochs,
                                      max_sequence_length=max_sequence_length, seed=seed)
            configure_train_task(encoder, options)  # the run's other training: GPU, retries
            train_args["base_model"] = encoder.outputs["model"]
        if options.weights_uri:  # not with a base model (PipelineOptions): it is a backbone's
            imagenet = dsl.importer(artifact_uri=options.weights_uri,
                                    artifact_class=dsl.Artifact, reimport=False)
            imagenet.set_display_name("imagenet-weights")
            train_args["weights_file"] = imagenet.output
        # A TFJob's workers do not mount the run's workspace: with train_workers > 1 the
        # checkpoints live on the training claim (kubeflow_job.py), so none is passed here.
        amp_checkpoints = "" if options.train_workers > 1 else options.checkpoint_dir(
            AMP_CHECKPOINTS)
        trained = ops["train"](precision=precision, autotune=autotune,
                               checkpoint_dir=amp_checkpoints, **train_args,
                               **train_workers_arguments(options))
        trained.set_display_name("train-amp")
        if options.train_workers > 1:
            configure_train_workers_task(trained, options)
        else:
            configure_train_task(trained, options)

        baseline_args = {}
        if options.with_float32_baseline:
            # one process at the AMP task's global batch: the two differ only in precision
            baseline = ops["train"](precision="float32",
                                    checkpoint_dir=options.checkpoint_dir(FLOAT32_CHECKPOINTS),
                                    batch_size_multiplier=options.train_workers, **train_args)
            baseline.set_display_name("train-float32")
            configure_train_task(baseline, options)
            baseline_args["baseline_model"] = baseline.outputs["model"]

        parity = ops["evaluate_parity"](
            data=data.outputs["data"], model=trained.outputs["model"],
            **baseline_args, max_accuracy_drop=max_accuracy_drop,
            min_agreement=min_agreement, max_relative_logit_diff=max_relative_logit_diff,
            max_baseline_accuracy_drop=max_baseline_accuracy_drop,
            baseline_alpha=baseline_alpha, chance_alpha=chance_alpha, min_accuracy=min_accuracy,
            metric_thresholds=metric_thresholds)
        set_resources(parity, options.default_resources)

        gate = ops["parity_gate"](verdict=parity.outputs["verdict"])
        set_resources(gate, options.gate_resources)

        exported = ops["export_savedmodel"](
            model=trained.outputs["model"], verdict=parity.outputs["verdict"],
            data=data.outputs["data"], model_name=model_name).after(gate)
        set_resources(exported, options.default_resources)

        converted = ops["convert_tflite"](
            saved_model=exported.outputs["saved_model"], data=data.outputs["data"],
            variants=tflite_variants)
        set_resources(converted, options.default_resources)

        with dsl.If(serving_target != "none", name="serving-target-set"):
            claim = {"model_store_claim": options.model_store_pvc} if options.model_store_pvc \
                else {}  # the claim a kserve InferenceService reads (pvc://<claim>/...)
            # the model now serving is read where deploy writes: on the model-store claim,
            # which only the tasks of this branch mount (the default run needs no claim)
            compared = ops["compare_serving"](
                data=data.outputs["data"], verdict=parity.outputs["verdict"],
                serving_model_store=serving_model_store, model_name=model_name,
                serving_alpha=serving_alpha, serving_rule=serving_rule,
                non_inferiority_margin=non_inferiority_margin,
                max_detectable_drop=max_detectable_drop, force=force)
            set_resources(compared, options.default_resources)
            compared.set_caching_options(False)  # what is serving changes between runs
            mount_model_store(compared, options)
            release = ops["serving_gate"](comparison=compared.outputs["comparison"])
            set_resources(release, options.gate_resources)
            deployed = ops["deploy_serving"](
                saved_model=exported.outputs["saved_model"], target=serving_target,
                model_store=serving_model_store, server_address=serving_address,
                namespace=options.serving_namespace or "", overlay=serving_overlay,
                tflite=converted.outputs["tflite"], serving_format=serving_format,
                tflite_variant=tflite_variant, compute_precision=serving_compute_precision,
                data=data.outputs["data"], **claim).after(release)  # data: the bf16 gate's
            set_resources(deployed, options.default_resources)
            deployed.set_caching_options(False)  # a deployment is a side effect, never cached
            label_serving_client(deployed)
            mount_model_store(deployed, options)

    # Each parameter's help (the KFP UI's) is that of the component input it sets.
    ampflow_pipeline.__doc__ = __doc__.splitlines()[0]  # KFP reads Args after a summary
    document_args(ampflow_pipeline, prepare_data, train, evaluate_parity, export_savedmodel,
                  convert_tflite, compare_serving, deploy_serving, renamed=PARAMETER_INPUTS)
    return dsl.pipeline(name=PIPELINE_NAME, description=__doc__.splitlines()[0],
                        pipeline_config=options.pipeline_config())(ampflow_pipeline)


def step_names(pipeline) -> dict[str, str]:
    """`{task name: step name}` of a built pipeline: the name KFP shows for each task.

    A task's name is its component's (`train`, `train-2`); where the pipeline gives it a
    display name (`train-amp`, `train-float32`), KFP's UI shows that, and so do the local run's
    lines and log files, so that a step has one name wherever it is read.
    """
    spec = pipeline.pipeline_spec
    names: dict[str, str] = {}
    dags = [spec.root.dag, *(c.dag for c in spec.components.values() if c.HasField("dag"))]
    for dag in dags:
        for name, task in dag.tasks.items():
            if not name.startswith("condition-"):
                names[name] = task.task_info.name or name
    return names


def compile_pipeline(path, options: PipelineOptions | None = None) -> str:
    """Compile the pipeline to KFP IR YAML at `path`; return the path."""
    from kfp import compiler

    compiler.Compiler().compile(build_pipeline(options), package_path=str(path))
    return str(path)
