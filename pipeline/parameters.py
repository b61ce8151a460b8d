"""The run-time parameters of the compiled pipeline: names, types, defaults, and their checks.

They are the pipeline's public interface (`ampflow submit --param NAME=VALUE`, the KFP UI's run
form, `run-local`'s flags). Listed here, without importing kfp, so that `submit --help` can name
them and a misspelt or mistyped `--param` is refused before anything is compiled or sent;
`build_pipeline`'s signature must match this table (tests/pipeline compare the compiled IR).

Names: `model` is the architecture (as `train --model`), `model_name` the served model name
(as TF Serving's `--model_name` and `export/serve/predict/deploy --model-name`).
"""

from __future__ import annotations

from ampflow.cliutil import did_you_mean
from ampflow.components.deploy_serving.config import (
    SERVING_FORMATS,
    TFLITE_VARIANTS,
    check_compute_precision_target,
    check_tflite_target,
)
from ampflow.components.evaluate_parity.config import SERVING_RULES
from ampflow.errors import ConfigError
from ampflow.pipeline.pipeline import (
    AUTO_RELATIVE_LOGIT_DIFF,
    DATA_DEFAULTS,
    DEFAULT_SERVING_OVERLAY,
    GATE_DEFAULTS,
    MODEL_STORE_MOUNT,
    SERVING_DEFAULTS,
    SERVING_OVERLAYS,
    TEXT_DATA_PARAMETERS,
    TEXT_DEFAULTS,
    TRAIN_DEFAULTS,
    XLA_VALUES,
)
from ampflow.serving.compute_precision import COMPUTE_PRECISIONS
from ampflow.serving.model_format import DEFAULT_MODEL_NAME, check_model_name

SERVING_TARGETS = ("none", "local", "kubernetes", "kserve")  # "none" + deploy_serving TARGETS
# name -> (type, default, help). Order: the order of `ampflow_pipeline`'s signature.
PIPELINE_PARAMETERS: dict[str, tuple[type, object, str]] = {
    "dataset": (str, DATA_DEFAULTS["dataset"], "TFDS dataset name (or an offline one)"),
    "test_fraction": (float, DATA_DEFAULTS["test_fraction"],
                      "share of each class held out for the test split (data without one)"),
    "model": (str, TRAIN_DEFAULTS["model"], "small_cnn, resnet50, mobilenet_v2, "
                                            "package.module:function or a .keras path"),
    "epochs": (int, TRAIN_DEFAULTS["epochs"], "training epochs"),
    "batch_size": (int, TRAIN_DEFAULTS["batch_size"], "training batch size per replica"),
    "accumulation_steps": (int, TRAIN_DEFAULTS["accumulation_steps"],
                           "micro-batches of batch_size summed per applied step (1 = off)"),
    "learning_rate": (float, TRAIN_DEFAULTS["learning_rate"],
                      "learning rate (0: the model's own, as train's default)"),
    "precision": (str, TRAIN_DEFAULTS["precision"],
                  "auto, float32, mixed_float16 or mixed_bfloat16"),
    "xla": (str, TRAIN_DEFAULTS["xla"], "XLA for the train step: " + ", ".join(XLA_VALUES)),
    "seed": (int, TRAIN_DEFAULTS["seed"], "seed"),
    "autotune": (bool, False, "time each (policy, XLA) candidate and train with the fastest"),
    "max_accuracy_drop": (float, GATE_DEFAULTS["max_accuracy_drop"],
                          "gate: max AMP-vs-twin accuracy drop (points)"),
    "min_agreement": (float, GATE_DEFAULTS["min_agreement"],
                      "gate: min argmax agreement with the float32 twin"),
    "max_relative_logit_diff": (float, AUTO_RELATIVE_LOGIT_DIFF,
                                "gate: max relative logit diff (< 0: per dtype)"),
    "max_baseline_accuracy_drop": (float, GATE_DEFAULTS["max_baseline_accuracy_drop"],
                                   "gate: max drop vs float32-trained (points)"),
    "baseline_alpha": (float, GATE_DEFAULTS["baseline_alpha"],
                       "gate: significance of the McNemar test"),
    "chance_alpha": (float, GATE_DEFAULTS["chance_alpha"],
                     "gate: significance of the binomial test against chance"),
    "min_accuracy": (float, GATE_DEFAULTS["min_accuracy"], "gate: min accuracy (0: not gated)"),
    "metric_thresholds": (str, GATE_DEFAULTS["metric_thresholds"],
                          "gate: NAME>=VALUE,NAME<=VALUE on metrics.json's numbers"),
    "serving_alpha": (float, GATE_DEFAULTS["serving_alpha"],
                      "gate: significance of the McNemar test against the model serving"),
    "serving_rule": (str, GATE_DEFAULTS["serving_rule"],
                     "gate: how the comparison with the model serving decides: "
                     + ", ".join(SERVING_RULES)),
    "non_inferiority_margin": (float, GATE_DEFAULTS["non_inferiority_margin"],
                               "gate: serving_rule=non-inferiority: the drop accepted (points)"),
    "max_detectable_drop": (float, GATE_DEFAULTS["max_detectable_drop"],
                            "gate: a worse model is refused unless the paired test detects "
                            "this drop (points)"),
    "force": (bool, GATE_DEFAULTS["force"],
              "gate: deploy a model the paired test cannot decide (recorded in the verdict)"),
    "tflite_variants": (str, DATA_DEFAULTS["tflite_variants"], "TFLite variants"),
    "model_name": (str, DEFAULT_MODEL_NAME, "served model name (TF Serving's --model_name)"),
    "serving_target": (str, SERVING_TARGETS[0], ", ".join(SERVING_TARGETS)),
    "serving_model_store": (str, MODEL_STORE_MOUNT, "model store the deploy step writes into"),
    "serving_address": (str, "", "host:port of the server the deploy step checks"),
    "serving_overlay": (str, DEFAULT_SERVING_OVERLAY,
                        "k8s overlay serving_target=kubernetes deploys: "
                        + ", ".join(SERVING_OVERLAYS)),
    "serving_format": (str, SERVING_DEFAULTS["serving_format"],
                       "what the deploy step publishes: " + ", ".join(SERVING_FORMATS)),
    "tflite_variant": (str, SERVING_DEFAULTS["tflite_variant"],
                       "serving_format=tflite: the converted variant to publish"),
    "serving_compute_precision": (str, SERVING_DEFAULTS["compute_precision"],
                                  "what ampflow serve computes in: float32, or bfloat16 after "
                                  "deploy's parity gate on the test split (a bf16 CPU)"),
    "model_path": (str, "", "directory to import a `model` builder from (in the image)"),
    "weights": (str, TRAIN_DEFAULTS["weights"],
                "a Keras applications ImageNet notop .h5 for resnet50/mobilenet_v2 (where the "
                "train task runs)"),
    "head_epochs": (int, TRAIN_DEFAULTS["head_epochs"],
                    "with weights: the first epochs, backbone frozen"),
    "head_learning_rate": (float, TRAIN_DEFAULTS["head_learning_rate"],
                           "with weights: the learning rate of the head epochs"),
    "image_size": (str, "", "H W, HxW or one number: the size to train and serve at"),
    "image_folder": (str, "", "a folder of class sub-folders, read instead of `dataset`"),
    "text_folder": (str, TEXT_DEFAULTS["text_folder"],
                    "a folder of class sub-folders of .txt files, read instead of `dataset`"),
    "text_file": (str, TEXT_DEFAULTS["text_file"],
                  "a .csv, .tsv or .jsonl table of texts, read instead of `dataset`"),
    "text_column": (str, TEXT_DEFAULTS["text_column"], "text_file: the column of the text"),
    "label_column": (str, TEXT_DEFAULTS["label_column"], "text_file: the column of the class"),
    "text_feature": (str, TEXT_DEFAULTS["text_feature"],
                     "a TFDS text dataset's text feature (empty: detected)"),
    "max_text_bytes": (int, TEXT_DEFAULTS["max_text_bytes"],
                       "a larger text file or row is left out and counted"),
    "max_sequence_length": (int, TEXT_DEFAULTS["max_sequence_length"],
                            "text: tokens per text (longer cut, shorter padded)"),
    "vocabulary_size": (int, TEXT_DEFAULTS["vocabulary_size"],
                        "text: most frequent training words kept, padding and [UNK] included"),
}

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
# Parameters whose value is one of a list: checked (with the closest suggested) before sending.
CHOICES: dict[str, tuple[str, ...]] = {"xla": XLA_VALUES, "serving_target": SERVING_TARGETS,
                                        "serving_rule": SERVING_RULES,
                                        "serving_overlay": SERVING_OVERLAYS,
                                        "serving_format": SERVING_FORMATS,
                                        "tflite_variant": TFLITE_VARIANTS,
                                        "serving_compute_precision": COMPUTE_PRECISIONS}
# Old names and values still taken, each with a one-line note: name -> (new name, values).
DEPRECATED: dict[str, tuple[str, dict[str, str]]] = {
    "jit_compile": ("xla", {"auto": "auto", "true": "on", "false": "off"}),
}


def _choices() -> dict[str, tuple[str, ...]]:
    from ampflow.components.train.precision.policy import POLICIES

    return {**CHOICES, "precision": tuple(POLICIES)}


def describe_parameters() -> str:
    """A table of the parameters (name, type, default, meaning), for `submit --help`."""
    width = max(map(len, PIPELINE_PARAMETERS))
    lines = ["pipeline parameters (--param NAME=VALUE), with their type and default:"]
    lines += [f"  {name.ljust(width)}  {text} ({kind.__name__}, default: {_shown(default)})"
              for name, (kind, default, text) in PIPELINE_PARAMETERS.items()]
    return "\n".join(lines)


def _shown(default: object) -> str:
    if default == "":
        return "empty"
    if isinstance(default, bool):
        return str(default).lower()
    return f"{default:g}" if isinstance(default, float) else str(default)


def parse_param(text: str) -> tuple[str, object]:
    """`NAME=VALUE` -> `(name, value)` cast to the parameter's type; ConfigError if unknown."""
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise ConfigError(f"--param must be NAME=VALUE. Received: {text!r}")
    if name in DEPRECATED:
        name, raw = _renamed(name, raw)
    if name not in PIPELINE_PARAMETERS:
        raise _unknown([name])
    kind = PIPELINE_PARAMETERS[name][0]
    choices = _choices().get(name)
    if choices is not None and raw not in choices:
        raise ConfigError(f"--param {name} must be one of {', '.join(choices)}. Received: "
                          f"{raw!r}{did_you_mean(raw, choices)}")
    try:
        if kind is bool:
            if raw.lower() not in _TRUE + _FALSE:
                raise ValueError(raw)
            return name, raw.lower() in _TRUE
        return name, kind(raw)
    except ValueError as e:
        raise ConfigError(f"--param {name} must be of type {kind.__name__}. Received: {raw!r}"
                          ) from e


def _renamed(name: str, raw: str) -> tuple[str, str]:
    """An old parameter spelling -> the new one, with a one-line note on stderr."""
    import sys

    new_name, values = DEPRECATED[name]
    new_raw = values.get(raw.lower(), raw)
    print(f"note: --param {name}={raw} is deprecated; use --param {new_name}={new_raw}",
          file=sys.stderr)
    return new_name, new_raw


def check_arguments(arguments: dict[str, object], options=None) -> None:
    """Refuse unknown names and a served name that is an architecture's (the old meaning).

    With the compile-time `options` (a PipelineOptions, or the parsed flags of one), also what
    they and the run's data must agree on (check_data_arguments).
    """
    unknown = sorted(set(arguments) - set(PIPELINE_PARAMETERS))
    if unknown:
        raise _unknown(unknown)
    model = arguments.get("model", PIPELINE_PARAMETERS["model"][1])
    model_name = arguments.get("model_name", PIPELINE_PARAMETERS["model_name"][1])
    check_model_names(str(model), str(model_name))
    _refuse_local_model(str(model))
    given = {name: str(arguments.get(name, PIPELINE_PARAMETERS[name][1])) for name in (
        "serving_format", "tflite_variant", "tflite_variants", "serving_target")}
    check_serving_format(**given)
    check_compute_precision_target(  # deploy would refuse it, but only after training
        str(arguments.get("serving_compute_precision", "float32")), given["serving_target"],
        given["serving_format"])
    steps = arguments.get("accumulation_steps", 1)
    if not isinstance(steps, int) or steps < 1:  # train would refuse it after prepare-data
        raise ConfigError(f"accumulation_steps must be an integer >= 1. Received: "
                          f"accumulation_steps={steps!r}")
    check_gate_arguments(arguments)
    if options is not None and getattr(options, "weights_uri", None) and arguments.get("weights"):
        raise ConfigError(  # the train task would refuse it, after prepare-data
            "weights_uri imports the ImageNet weights file the train tasks load, and the "
            "weights parameter names another: pass one. Received: weights_uri="
            f"{options.weights_uri!r}, weights={arguments['weights']!r}")
    check_data_arguments(arguments, options)


def check_gate_arguments(arguments: dict[str, object]) -> None:
    """The gate's settings, checked by the evaluate step's own config before anything runs.

    A bad `metric_thresholds` or an alpha out of (0, 1) would otherwise stop the run at
    evaluate, after training.
    """
    from pathlib import Path

    from ampflow.components.evaluate_parity.config import EvaluateConfig

    gate = {name: arguments[name] for name in GATE_DEFAULTS if name in arguments}
    EvaluateConfig(model_dir=Path("."), data_dir=Path("."), output_dir=Path("."), **gate)


# The data parameters prepare-data's own config checks (its alternatives and text options).
_DATA_ARGUMENTS = ("dataset", "test_fraction", "image_folder", "image_size",
                   *TEXT_DATA_PARAMETERS)


def check_data_arguments(arguments: dict[str, object], options=None) -> None:
    """The data source, the text settings and the model's modality, before anything runs.

    prepare-data's config and the tokenizer's settings check themselves (a text file and an
    image folder together, a sequence length of 0); then a model that cannot take the data
    (bert_tiny on digits, small_cnn on a text folder) and text settings on image data are
    refused here, where the modality is known without reading the data: otherwise train
    would refuse them, after prepare-data ran. Where the compile-time `options` give the train
    tasks a base model (imported or pretrained), train fine-tunes that, not `model`; and
    pretraining needs texts.
    """
    from pathlib import Path

    from ampflow.components.prepare_data.config import PrepareDataConfig
    from ampflow.modeling.tokenizer import TokenizerConfig

    given = {name: arguments.get(name, PIPELINE_PARAMETERS[name][1]) for name in _DATA_ARGUMENTS}
    PrepareDataConfig(output_dir=Path("."), **{
        name: (value if value != "" or name == "dataset" else None)
        for name, value in given.items()})
    text = {name: arguments.get(name, TEXT_DEFAULTS[name])
            for name in ("max_sequence_length", "vocabulary_size")}
    TokenizerConfig(**text)
    modality = data_modality(given)
    if modality is None:
        return
    if options is not None and options.pretrain_epochs:
        _check_pretraining_data(options.pretrain_epochs, modality, given)
    if options is None or not (options.base_model_uri or options.pretrain_epochs):
        _check_model_fits(str(arguments.get("model", PIPELINE_PARAMETERS["model"][1])),
                          modality, given)
    if modality == "image":
        for name, value in text.items():
            if value != TEXT_DEFAULTS[name]:
                raise ConfigError(f"{name} is for text data, and {_source(given)} holds images: "
                                  f"leave it out. Received: {name}={value!r}")


def data_modality(given: dict[str, object]) -> str | None:
    """"text" or "image" when the data parameters say it; None for a TFDS name (read later).

    A text folder or table, a TFDS text feature or the offline text dataset is text; an image
    folder, an image size or an offline image dataset is images.
    """
    from ampflow.components.prepare_data.config import OFFLINE_DATASETS
    from ampflow.data.catalog import ROTTEN_TOMATOES_NAME

    if given.get("text_folder") or given.get("text_file") or given.get("text_feature") or \
            given.get("dataset") == ROTTEN_TOMATOES_NAME:
        return "text"
    if given.get("image_folder") or given.get("image_size") or given.get(
            "dataset") in OFFLINE_DATASETS:
        return "image"
    return None


def _source(given: dict[str, object]) -> str:
    """The data parameter that names the source, as `name='value'`."""
    for name in ("text_folder", "text_file", "image_folder"):
        if given.get(name):
            return f"{name}={given[name]!r}"
    return f"dataset={given['dataset']!r}"


def _check_pretraining_data(epochs: int, modality: str, given: dict[str, object]) -> None:
    """The pretrain step's own refusal of images (its modality seam), before anything runs.

    A TFDS name's modality is read only by prepare-data: the pretrain task then refuses it.
    """
    from ampflow.components.pretrain.modalities import check_corpus

    try:
        check_corpus({"modality": modality}, _source(given))
    except ConfigError as e:
        raise ConfigError(f"pretrain_epochs pretrains on the run's texts, but {e} Received: "
                          f"pretrain_epochs={epochs}") from e


def _check_model_fits(model: str, modality: str, given: dict[str, object]) -> None:
    """A built-in model takes one modality; a builder or .keras file is checked by train."""
    from ampflow.modeling.models import image_model_names, text_model_names

    fits = text_model_names() if modality == "text" else image_model_names()
    other = image_model_names() if modality == "text" else text_model_names()
    if model in other:
        kind = "an image model (it takes pixels)" if modality == "text" else (
            "a text model (it takes token ids)")
        holds = "text" if modality == "text" else "images"
        raise ConfigError(f"model {model!r} is {kind}, and {_source(given)} holds {holds}: "
                          f"choose one of {', '.join(fits)}, a builder or a .keras file. "
                          f"Received: model={model!r}")


def check_serving_format(serving_format: str, tflite_variant: str, tflite_variants: str,
                         serving_target: str) -> None:
    """A TFLite deploy must name a variant the run converts, on a target that can serve it.

    Checked before anything runs: the deploy step would refuse both, but only after training.
    """
    if serving_format != "tflite":
        return
    converted = [v.strip() for v in tflite_variants.split(",") if v.strip()]
    if tflite_variant not in converted:
        raise ConfigError(f"tflite_variant must be one of the variants the run converts "
                          f"(tflite_variants={','.join(converted)}) when serving_format=tflite. "
                          f"Received: tflite_variant={tflite_variant!r}")
    check_tflite_target(serving_target)


def check_model_names(model: str, model_name: str) -> None:
    """`model` must be what train --model takes; `model_name` a served name, not an architecture.

    Before the names were made one per meaning, `model_name` was the architecture here; a
    served name equal to a different architecture is that old usage, and training the default
    architecture silently under that name would hide it.
    """
    from ampflow.modeling.models import model_names
    from ampflow.modeling.user_model import parse_model_spec

    parse_model_spec(model, model_names())
    check_model_name(model_name, "model_name")
    if model_name in model_names() and model_name != model:
        raise ConfigError(
            f"model_name is the served model name (TF Serving's --model_name); the architecture "
            f"is `model`. Received: model_name={model_name!r}, model={model!r} (did you mean "
            f"model={model_name!r}?)")


def _refuse_local_model(model: str) -> None:
    """A .keras file or a checkpoint dir of this machine is not where a train pod runs.

    The run's `model` is a text the pod reads; a file the pod does not see would fail the
    train task after prepare-data. Such a model reaches the pod as an input artifact.
    """
    from pathlib import Path

    from ampflow.modeling.base_model import UPLOAD_HINT
    from ampflow.modeling.models import model_names
    from ampflow.modeling.user_model import parse_model_spec

    kind = parse_model_spec(model, model_names()).kind
    if kind in ("file", "checkpoint") and Path(model).expanduser().exists():
        raise ConfigError(
            "--param model must be a built-in or a builder: a .keras file or a checkpoint dir "
            "reaches the train pod as --base-model-uri (a dsl.importer), not as a path the pod "
            f"does not see. Received: model={model!r}; {UPLOAD_HINT} as --base-model-uri")


def _unknown(names: list[str]) -> ConfigError:
    near = did_you_mean(names[0], PIPELINE_PARAMETERS)
    return ConfigError(f"--param {names[0]} is not a pipeline parameter{near} (`ampflow submit "
                       f"--help` lists them all). Received: {', '.join(names)}")
