"""What the convert step feeds a text model: token ids of real sentences, the vocabulary beside.

The pip LiteRT runtime runs no string op (docs/DESIGN.md "Text": a converted TextVectorization
fails to prepare, "FlexStringLower"), so the TFLite variants are converted from the exported
SavedModel's `token_ids` signature (`input_ids` int32 [-1, L], 0 = padding) and the vocabulary
the SavedModel ships (`assets/vocab.txt`, `assets/tokenizer.json`) is copied beside them, for the
app to tokenize with (src/ampflow/modeling/tokenizer.py says the rule).

The reference every variant is compared with is the SavedModel as served: `serving_default` on
the raw test sentences, tokenized in its graph. The variants get the same sentences tokenized
outside the graph with the shipped vocabulary, so a check that passes also proves that
tokenizing with vocab.txt gives the ids the served model uses. full_int8 is calibrated on real
sentences of the TRAINING split, tokenized the same way (never the test split it is checked on).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ampflow.artifacts.signature_names import TEXT_INPUT, TOKEN_IDS_SIGNATURE
from ampflow.data.modality import MODALITY_TEXT
from ampflow.errors import ConfigError, ModelLoadError
from ampflow.modeling.tokenizer import token_ids
from ampflow.progress import Progress
from ampflow.serving.model_format import DEFAULT_SIGNATURE, PROBABILITIES_OUTPUT

_USAGE = ("Input int32 token ids [batch, {length}]: tokenize each text with vocab.txt as "
          "tokenizer.json says (lower-case, strip ASCII punctuation, split on whitespace; "
          "id = line number in vocab.txt, 1 = [UNK] for an unknown word; cut or pad with 0 to "
          "{length}); outputs float32 probabilities (int8 with int8_io: dequantize with the "
          "output tensor's scale and zero_point) and int64 class_ids.")


class TextReference:
    """The text SavedModel as served: raw strings into `serving_default`, probabilities out."""

    def __init__(self, saved_model_dir: str | os.PathLike):
        import tensorflow as tf

        try:
            loaded = tf.saved_model.load(os.fspath(saved_model_dir))
        except Exception as e:
            raise ModelLoadError(f"{saved_model_dir} is not a loadable SavedModel: {e}") from e
        missing = [k for k in (DEFAULT_SIGNATURE, TOKEN_IDS_SIGNATURE)
                   if k not in loaded.signatures]
        if missing:
            raise ModelLoadError(f"a text SavedModel must have the signatures serving_default "
                                 f"and {TOKEN_IDS_SIGNATURE!r} (docs/ARTIFACTS.md). Received: "
                                 f"{sorted(loaded.signatures)}")
        self.loaded = loaded  # keeps the variables and vocabulary alive; the converter
        # reuses it
        self._fn = loaded.signatures[DEFAULT_SIGNATURE]
        ids_spec, = loaded.signatures[TOKEN_IDS_SIGNATURE].structured_input_signature[1].values()
        self.input_shape = tuple(ids_spec.shape.as_list()[1:])

    def predict(self, texts: np.ndarray, batch_size: int, desc: str | None = None) -> np.ndarray:
        """Probabilities [N, num_classes] for UTF-8 texts (an object array of bytes)."""
        import tensorflow as tf

        out = []
        with Progress(len(texts), desc or "", unit="example", enabled=bool(desc)) as progress:
            for start in range(0, len(texts), batch_size):
                batch = tf.constant(texts[start:start + batch_size], tf.string)
                out.append(self._fn(**{TEXT_INPUT: batch})[PROBABILITIES_OUTPUT].numpy())
                progress.update(len(batch))
        return np.concatenate(out)

    def time(self, texts: np.ndarray, *, runs: int, warmup: int, batch_size: int):
        """The same timing as for the TFLite variants, for the report's reference row."""
        import tensorflow as tf

        from ampflow.components.convert_tflite.checks import _time

        one = tf.constant(texts[:1], tf.string)
        return _time(lambda: self._fn(**{TEXT_INPUT: one}),
                     lambda some: self.predict(some, batch_size), texts,
                     runs=runs, warmup=warmup, batch_size=batch_size)


@dataclass(frozen=True)
class TextInputs:
    """A text model's conversion inputs: the reference, test sentences and their ids."""

    saved_model_dir: Path
    tokenizer: Any  # ampflow.modeling.tokenizer.TextTokenizer, read from the SavedModel's assets
    reference: TextReference
    reference_inputs: np.ndarray  # UTF-8 test sentences (object array of bytes)
    model_inputs: np.ndarray  # int32 [N, L], their ids
    labels: np.ndarray
    signature_key: str = TOKEN_IDS_SIGNATURE
    modality: ClassVar[str] = MODALITY_TEXT  # report.json's

    @classmethod
    def of(cls, saved_model_dir: Path, config) -> TextInputs:
        from ampflow.data import load_texts

        tokenizer = shipped_tokenizer(saved_model_dir)
        reference = TextReference(saved_model_dir)
        if reference.input_shape != (tokenizer.sequence_length,):
            raise ModelLoadError(f"{saved_model_dir}'s token_ids signature takes "
                                 f"{list(reference.input_shape)} ids but its tokenizer.json "
                                 f"makes {tokenizer.sequence_length}")
        texts, labels = load_texts(config.data_dir, "test", limit=config.test_limit)
        if not texts:
            raise ConfigError(f"data_dir's test split must hold at least one text. Received: "
                              f"none in {config.data_dir}")
        return cls(saved_model_dir, tokenizer, reference, _utf8(texts),
                   token_ids(tokenizer, texts), labels)

    def representative(self, config) -> np.ndarray:
        """Token ids of `representative_size` training sentences drawn with `seed`."""
        from ampflow.data import load_texts

        texts, _ = load_texts(config.data_dir, "train")
        rng = np.random.default_rng(config.seed)
        take = np.sort(rng.choice(len(texts), size=min(config.representative_size, len(texts)),
                                  replace=False))
        return token_ids(self.tokenizer, [texts[i] for i in take])

    def ship(self, directory: Path) -> list[str]:
        """Copy the vocabulary beside the .tflite files; return the names written."""
        from ampflow.modeling.tokenizer import TOKENIZER_FILE, VOCAB_FILE

        for name in (VOCAB_FILE, TOKENIZER_FILE):
            shutil.copyfile(self.saved_model_dir / "assets" / name, directory / name)
        return [VOCAB_FILE, TOKENIZER_FILE]

    def variant_extras(self) -> dict[str, Any]:
        """What a text variant's JSON adds: the tokenizer files and how to make the input."""
        from ampflow.modeling.tokenizer import TOKENIZER_FILE, VOCAB_FILE

        return {"modality": "text",
                "tokenizer": {"vocabulary_file": VOCAB_FILE, "settings_file": TOKENIZER_FILE,
                              "max_sequence_length": self.tokenizer.sequence_length,
                              "vocabulary_in_use": self.tokenizer.vocabulary_size},
                "usage": _USAGE.format(length=self.tokenizer.sequence_length)}


def shipped_tokenizer(saved_model_dir: Path):
    """The tokenizer the export shipped in `assets/`; a ModelLoadError where it is missing."""
    from ampflow.modeling.tokenizer import load_tokenizer

    try:
        return load_tokenizer(Path(saved_model_dir) / "assets")
    except ConfigError as e:
        raise ModelLoadError(f"{saved_model_dir} is a text SavedModel without its vocabulary "
                             f"(export writes assets/vocab.txt and tokenizer.json): {e}") from e


def _utf8(texts: list[str]) -> np.ndarray:
    return np.array([t.encode("utf-8") for t in texts], dtype=object)
