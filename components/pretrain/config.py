"""What `pretrain` is asked to do: the data, the new checkpoint's folder, the encoder's sizes.

Flat fields (one flag each) that map onto the library's `PretrainConfig`, whose checks they
reuse; kept free of TensorFlow so that `ampflow --help` stays fast.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampflow.errors import ConfigError
from ampflow.modeling.pretrain import PretrainConfig
from ampflow.modeling.wordpiece_vocab import VocabularyConfig

_LIBRARY = PretrainConfig()
_VOCABULARY = VocabularyConfig()


def vocabulary_named(error: ConfigError) -> ConfigError:
    """The library's error with its vocabulary's `size` named as this step's field."""
    return ConfigError(re.sub(r"\bsize\b", "vocabulary_size", str(error)))


@dataclass(frozen=True)
class PretrainStepConfig:
    """A masked-LM run on the training split's texts (labels unused), written to output_dir."""

    data_dir: Path = field(metadata={
        "help": "A prepared text dataset (ampflow prepare-data): its training split's texts are "
                "the corpus; its test split is never read."})
    output_dir: Path = field(metadata={
        "help": "The new checkpoint's folder (Hugging Face layout: config.json, "
                "model.safetensors, vocab.txt, tokenizer_config.json, pretraining.json). It "
                "must not exist: nothing is overwritten."})
    num_hidden_layers: int = field(default=_LIBRARY.num_hidden_layers, metadata={
        "help": "Transformer layers of the encoder (bert_tiny: 2)."})
    hidden_size: int = field(default=_LIBRARY.hidden_size, metadata={
        "help": "Width of the encoder (bert_tiny: 128); the feed-forward is 4x."})
    num_attention_heads: int = field(default=_LIBRARY.num_attention_heads, metadata={
        "help": "Attention heads; must divide --hidden-size."})
    max_sequence_length: int = field(default=_LIBRARY.max_sequence_length, metadata={
        "help": "Tokens a text, [CLS] and [SEP] included; also the position table, so "
                "`train --model DIR` fine-tunes at most this long."})
    vocabulary_size: int = field(default=_VOCABULARY.size, metadata={
        "help": "WordPiece vocabulary built from the corpus (special tokens and characters "
                "included)."})
    lower_case: bool = field(default=_VOCABULARY.do_lower_case, metadata={
        "help": "Lower-case and strip accents before WordPiece, as uncased BERT checkpoints."})
    epochs: int = field(default=_LIBRARY.epochs, metadata={
        "help": "Passes over the corpus, each masked anew (dynamic masking)."})
    batch_size: int = field(default=_LIBRARY.batch_size, metadata={"help": "Texts a step."})
    learning_rate: float = field(default=_LIBRARY.learning_rate, metadata={
        "help": "Peak of AdamW's schedule: linear warm-up over the first tenth of the steps, "
                "then decay."})
    mask_rate: float = field(default=_LIBRARY.mask_rate, metadata={
        "help": "Share of the tokens predicted (BERT's 0.15: of them 80 percent [MASK], 10 "
                "random, 10 kept)."})
    steps_per_epoch: int | None = field(default=None, metadata={
        "help": "Steps an epoch (default: the whole corpus once)."})
    seed: int = field(default=_LIBRARY.seed, metadata={
        "help": "Seeds the initialization and the masking."})

    def __post_init__(self):
        for name in ("data_dir", "output_dir"):  # a KFP artifact's path is a str
            object.__setattr__(self, name, Path(getattr(self, name)))
        try:
            self.library_config()  # the library's checks, one line each, before any work
        except ConfigError as e:
            raise vocabulary_named(e) from e

    def library_config(self) -> PretrainConfig:
        """The same run as the library's `PretrainConfig`."""
        return PretrainConfig(
            num_hidden_layers=self.num_hidden_layers, hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            max_sequence_length=self.max_sequence_length,
            vocabulary=VocabularyConfig(size=self.vocabulary_size,
                                        do_lower_case=self.lower_case),
            epochs=self.epochs, batch_size=self.batch_size, learning_rate=self.learning_rate,
            mask_rate=self.mask_rate, steps_per_epoch=self.steps_per_epoch, seed=self.seed)


@dataclass(frozen=True)
class PretrainResult:
    """Where the checkpoint went and what its pretraining.json says."""

    output_dir: Path
    report: dict[str, Any]
