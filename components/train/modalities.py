"""train's side of the modality seam: the options each modality takes and the model it checks.

`training_of(info)` is asked once per use; its `check_options` refuses an option the data
cannot use (step.py), its `model_to_check` builds the model the AMP pre-flight checks
(preflight/rules.py). The input pipelines, the tokenizer and the built model are run/build.py's
tables (INPUTS, PREPROCESSORS, MODELS), keyed by the same names. A new modality adds a class
here and its rows there.
"""

from __future__ import annotations

from ampflow.components.train.config import AUTO_BATCH
from ampflow.data.modalities import modality_of
from ampflow.data.modality import MODALITY_IMAGE, MODALITY_TEXT
from ampflow.errors import ConfigError

# `config` below is a step.TrainConfig.


class ImageTraining:
    """Images: the image options apply; the model is sized by the image shape."""

    name = MODALITY_IMAGE

    def check_options(self, config, info: dict) -> None:
        """Text options (--max-sequence-length, --vocabulary-size) set on images: one line."""
        for name, value in config.text_settings_given().items():
            raise ConfigError(f"{name} is for text data, and {config.data_dir} holds "
                              f"{self.name} data: leave it out. Received: {name}={value}")

    def check_model_options(self, config, info: dict) -> None:
        """check-model's text option on images: train's rule (a CheckModelConfig)."""
        self.check_options(config, info)

    def model_to_check(self, model, info: dict, *, model_path=None, image_size=None,
                       sequence_length=None, vocabulary_size=None, checkpoint=None,
                       weights=None):
        """(`models.BuiltModel`, input shape, classes) on the data's image shape.

        With `weights` (train --weights) the backbone holds the file's tensors: a file of
        another architecture or layout is refused here, before any training.
        """
        from ampflow.modeling.models import make_model

        built = make_model(model, tuple(info["image_shape"]), info["num_classes"],
                           image_size=image_size, model_path=model_path)
        if weights:
            load_weights(built.model, weights)
        return built, tuple(info["image_shape"]), int(info["num_classes"])


class TextTraining:
    """Texts: the tokenizer options apply; the model takes `[batch, sequence length]` ids."""

    name = MODALITY_TEXT

    def check_options(self, config, info: dict) -> None:
        """Image options set on text data: one line.

        --image-size, --augment and --batch-size auto (whose memory probe feeds images).
        """
        image_only = {"image_size": config.image_size, "augment": config.augment or None,
                      "batch_size": config.batch_size if config.batch_size == AUTO_BATCH
                      else None}
        given = {name: value for name, value in image_only.items() if value is not None}
        if given:
            name, value = next(iter(given.items()))
            raise ConfigError(f"{name} is for image data, and {config.data_dir} holds text "
                              f"(tokenized to --max-sequence-length ids): leave it out"
                              f"{' and pass a number' if name == 'batch_size' else ''}. "
                              f"Received: {name}={value!r}")

    def check_model_options(self, config, info: dict) -> None:
        """check-model's image option on texts (--image-size): one line, as train says it."""
        if config.image_size is not None:
            raise ConfigError(f"image_size is for image data, and {config.data_dir} holds text "
                              f"(tokenized to --max-sequence-length ids): leave it out. "
                              f"Received: image_size={config.image_size!r}")

    def model_to_check(self, model, info: dict, *, model_path=None, image_size=None,
                       sequence_length=None, vocabulary_size=None, checkpoint=None,
                       weights=None):
        """(`models.BuiltModel`, input shape, classes) on token ids (--weights is images').

        The tokenizer's defaults where not given: the check needs shapes, not a vocabulary.
        `checkpoint`: a pretrained checkpoint `model` names, read already.
        """
        from ampflow.modeling.models import make_text_model
        from ampflow.modeling.tokenizer import TokenizerConfig

        tokens = TokenizerConfig(**{k: v for k, v in (
            ("max_sequence_length", sequence_length), ("vocabulary_size", vocabulary_size))
            if v is not None})
        built = make_text_model(model, tokens.max_sequence_length, tokens.vocabulary_size,
                                int(info["num_classes"]), model_path=model_path,
                                checkpoint=checkpoint)
        return built, (int(tokens.max_sequence_length),), int(info["num_classes"])


def load_weights(model, path) -> int:
    """Put an ImageNet weights file into `model`'s backbone, saying so; the tensors loaded."""
    import logging

    from ampflow.modeling.imagenet_weights import load_applications_weights

    count = load_applications_weights(model, path)
    logging.getLogger(__name__).info("loaded %d tensors of %s into %s's backbone", count, path,
                                     model.name)
    return count


TRAINING = {m.name: m for m in (ImageTraining(), TextTraining())}


def training_of(info: dict):
    """The training side of the data's modality (its dataset_info.json)."""
    return TRAINING[modality_of(info).name]
