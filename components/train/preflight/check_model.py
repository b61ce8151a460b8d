"""`ampflow check-model`: the AMP check of a model on its data, without training it.

The same check runs at the start of every `train` (`preflight_model` in step.py), before any
epoch is spent; this command runs it alone, so a user can see what their model does under a
policy (its layers' dtypes, the casts a custom layer adds, float16-unsafe ops) before
submitting a pipeline. Writes `<output_dir>/amp_report.json` when an output dir is given.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from ampflow.components.train.precision.policy import POLICIES
from ampflow.errors import ConfigError

log = logging.getLogger(__name__)


def _as_train(name: str):
    """The field `name` of TrainConfig: its default and help, written once (STYLE rule 13)."""
    from ampflow.components.train.config import TrainConfig

    source = TrainConfig.__dataclass_fields__[name]
    return field(default=source.default, metadata=source.metadata)


@dataclass(frozen=True)
class CheckModelConfig:
    """What to check: the model as train takes it, the data it will see, the policy."""

    data_dir: Path = field(metadata={
        "help": "A prepared dataset dir (from prepare-data): its image shape and classes."})
    model: str = _as_train("model")
    model_path: str | None = _as_train("model_path")
    precision: str = _as_train("precision")
    jit_compile: bool | None = _as_train("jit_compile")  # --xla: reported as train decides it
    image_size: int | None = _as_train("image_size")
    max_sequence_length: int = _as_train("max_sequence_length")  # TokenizerConfig's default
    weights: str | None = _as_train("weights")
    output_dir: Path | None = field(default=None, metadata={
        "help": "Write amp_report.json here (default: print only)."})

    @property
    def model_spec(self):
        """`model` parsed (user_model.ModelSpec): once per text, as TrainConfig's."""
        from ampflow.components.train.config import parsed_model_spec

        return parsed_model_spec(self.model)

    def __post_init__(self) -> None:
        self.model_spec  # noqa: B018  (a bad --model is one line now)
        if self.precision not in POLICIES:
            from ampflow.cliutil import invalid_choice

            raise ConfigError(invalid_choice("precision", self.precision, POLICIES))
        if self.weights:  # train's rule: a built-in ImageNet backbone only
            from ampflow.modeling.imagenet_weights import WEIGHTS_MODELS

            spec = self.model_spec
            if spec.kind != "builtin" or spec.text not in WEIGHTS_MODELS:
                raise ConfigError(
                    "weights loads Keras applications' ImageNet weights into a built-in "
                    f"backbone: model must be {' or '.join(WEIGHTS_MODELS)}. Received: "
                    f"model={self.model!r} with weights={self.weights!r}")
        if self.image_size is not None and self.image_size < 8:
            raise ConfigError(f"image_size must be >= 8. Received: image_size={self.image_size}")
        from ampflow.modeling.tokenizer import TokenizerConfig

        TokenizerConfig(max_sequence_length=self.max_sequence_length)  # its rule: one line

    def text_settings_given(self) -> dict[str, int]:
        """The text options set away from their defaults (what train's check refuses on images)."""
        default = CheckModelConfig.__dataclass_fields__["max_sequence_length"].default
        given = self.max_sequence_length
        return {"max_sequence_length": given} if given != default else {}

    def read_checkpoint(self):
        """A pretrained checkpoint `model` names, read once and bounded as train bounds it.

        Past its `max_position_embeddings`, --max-sequence-length is one line naming its
        config.json. None for any other model.
        """
        if self.model_spec.kind != "checkpoint":
            return None
        from ampflow.modeling.pretrained_text import read_checkpoint_for

        return read_checkpoint_for(self.model_spec.text, self.max_sequence_length)


def run_check_model(config: CheckModelConfig, hardware=None):
    """Build the model under the policy, check it, print the table; ConfigError if refused.

    The table's notes name the hardware's native half-precision formats and warn of a policy
    that is not native (`precision.native_formats`, the rule train's auto and --autotune use);
    `hardware` (a `HardwareInfo`) is detected unless given.
    """
    import dataclasses

    import keras

    from ampflow.components.train.modalities import training_of
    from ampflow.components.train.precision.policy import configure_precision, native_format_notes
    from ampflow.components.train.preflight.report import write_amp_report
    from ampflow.components.train.preflight.rules import amp_check_of
    from ampflow.data import load_dataset_info

    info = load_dataset_info(config.data_dir)
    training_of(info).check_model_options(config, info)  # an option the data cannot use
    checkpoint = config.read_checkpoint()  # before TensorFlow starts: a bad one is one line
    if config.weights:  # another architecture's file: one line before TensorFlow starts
        from ampflow.modeling.imagenet_weights import check_weights_file

        check_weights_file(config.weights, config.model_spec.text)
    previous = keras.mixed_precision.global_policy().name
    try:
        setup = configure_precision(config.precision, config.jit_compile,  # logs XLA as train
                                    hardware, modality=info.get("modality"))
        report = amp_check_of(config.model_spec, info, model_path=config.model_path,
                              image_size=config.image_size, weights=config.weights,
                              sequence_length=config.max_sequence_length, checkpoint=checkpoint)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    report = dataclasses.replace(report, notes=report.notes + native_format_notes(
        setup.policy, setup.native))
    print(report.table())
    if not report.errors:  # what train checks next: the model reloads for evaluate and export
        from ampflow.components.train.preflight.reload_check import check_reloads

        check_reloads(report.model, config.model_spec, config.model_path)
    if config.output_dir is not None:
        from ampflow.files import ensure_writable_dir

        write_amp_report(report, ensure_writable_dir(config.output_dir, "output_dir"))
    if report.errors:
        raise ConfigError(f"model {config.model!r} cannot train under {report.policy}: "
                          + "; ".join(report.errors))
    return report

