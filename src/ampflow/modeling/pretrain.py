"""Pretrain a BERT encoder here: masked-language modelling on unlabelled texts, Hugging Face out.

`pretrain_mlm(texts, directory, config)` builds a WordPiece vocabulary from `texts`
(`wordpiece_vocab`), tokenizes them with the tokenizer `--model DIR` will use
(`wordpiece.WordPieceTokenizer`), trains `bert.bert_encoder` with BERT's masked-LM objective
(`mlm`) and BERT's optimizer (AdamW, linear warm-up over 10 % of the steps then linear decay,
`fine_tuning.fine_tune_optimizer`), and writes the encoder in the Hugging Face layout
(`hf_bert_writer`) with `pretraining.json` beside it. `initial_checkpoint` writes the same
architecture and vocabulary at its initialization: the from-scratch arm a transfer
measurement compares against (benchmarks/text_transfer.py).

The caller chooses the texts: to measure transfer honestly they are the training split's
only, so no test text is ever seen, labelled or not.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ampflow.errors import ConfigError
from ampflow.modeling.wordpiece_vocab import VocabularyConfig, build_wordpiece_vocabulary

REPORT_FILE = "pretraining.json"
_BATCH = 256


@dataclass(frozen=True)
class PretrainConfig:
    """The encoder's sizes (bert_tiny's by default) and the masked-LM run's settings."""

    num_hidden_layers: int = 2
    hidden_size: int = 128
    num_attention_heads: int = 2
    max_sequence_length: int = 64  # also the position table: fine-tune at most this long
    vocabulary: VocabularyConfig = field(default_factory=VocabularyConfig)
    epochs: int = 8
    batch_size: int = 32
    learning_rate: float = 1e-3  # the peak of the warm-up/decay schedule
    mask_rate: float = 0.15
    max_predictions: int = 20  # per sequence: BERT's max_predictions_per_seq at this length
    steps_per_epoch: int | None = None  # None: the whole split each epoch
    seed: int = 0

    def __post_init__(self):
        for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "epochs",
                     "batch_size", "max_predictions", "max_sequence_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1. Received: {name}={value!r}")
        if self.max_sequence_length < 3:
            raise ConfigError("max_sequence_length must be >= 3 ([CLS], a token, [SEP]). "
                              f"Received: max_sequence_length={self.max_sequence_length}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError("hidden_size must be a multiple of num_attention_heads. Received: "
                              f"hidden_size={self.hidden_size}, "
                              f"num_attention_heads={self.num_attention_heads}")
        if not 0 < self.mask_rate < 1:
            raise ConfigError(f"mask_rate must be in (0, 1). Received: "
                              f"mask_rate={self.mask_rate!r}")
        if not self.learning_rate > 0:
            raise ConfigError(f"learning_rate must be > 0. Received: "
                              f"learning_rate={self.learning_rate!r}")
        if self.steps_per_epoch is not None and self.steps_per_epoch < 1:
            raise ConfigError(f"steps_per_epoch must be >= 1 or None. Received: "
                              f"steps_per_epoch={self.steps_per_epoch!r}")

    def bert_config(self, vocab_size: int):
        """The encoder's `BertConfig` (4 × hidden feed-forward, erf GELU, as BERT's)."""
        from ampflow.modeling.hf_bert import BertConfig

        return BertConfig(vocab_size=vocab_size, hidden_size=self.hidden_size,
                          num_hidden_layers=self.num_hidden_layers,
                          num_attention_heads=self.num_attention_heads,
                          intermediate_size=4 * self.hidden_size,
                          max_position_embeddings=self.max_sequence_length)


def initial_checkpoint(vocabulary: Sequence[str], directory: str | os.PathLike,
                       config: PretrainConfig = PretrainConfig(), *, seed: int = 0) -> Path:
    """The encoder at its initialization (Keras's initializers, `seed`), in the layout."""
    import keras

    from ampflow.modeling.bert import bert_encoder
    from ampflow.modeling.hf_bert_writer import encoder_tensors, write_hf_bert

    keras.utils.set_random_seed(seed)
    bert = config.bert_config(len(vocabulary))
    encoder = bert_encoder(bert)
    report = {"made_by": "ampflow.modeling.pretrain.initial_checkpoint", "seed": seed,
              "config": _jsonable(config)}
    return write_hf_bert(directory, bert, vocabulary, encoder_tensors(encoder, bert),
                         do_lower_case=config.vocabulary.do_lower_case,
                         extra_files={REPORT_FILE: json.dumps(report, indent=2) + "\n"})


def pretrain_mlm(texts: Sequence[str], directory: str | os.PathLike,
                 config: PretrainConfig = PretrainConfig()) -> Path:
    """Pretrain on `texts` (unlabelled) and write the checkpoint to `directory`; its path."""
    import keras

    from ampflow.modeling.bert import bert_encoder
    from ampflow.modeling.hf_bert_writer import encoder_tensors, write_hf_bert
    from ampflow.modeling.mlm import MaskedLmModel

    if not texts:
        raise ConfigError("Expected texts to pretrain on. Received: none")
    began = time.perf_counter()
    vocabulary = build_wordpiece_vocabulary(texts, config.vocabulary)
    token_ids = _tokenize(texts, vocabulary, config)
    keras.utils.set_random_seed(config.seed)
    bert = config.bert_config(len(vocabulary))
    model = MaskedLmModel(bert_encoder(bert), bert)
    steps = config.steps_per_epoch or len(token_ids) // config.batch_size or 1
    losses = _fit(model, token_ids, vocabulary, config, steps)
    report = {"made_by": "ampflow.modeling.pretrain.pretrain_mlm", "texts": len(texts),
              "vocabulary_size": len(vocabulary), "steps_per_epoch": steps,
              "masked_lm_loss_per_epoch": losses, "seconds": round(time.perf_counter() - began, 1),
              "config": _jsonable(config)}
    return write_hf_bert(directory, bert, vocabulary, encoder_tensors(model.encoder, bert),
                         do_lower_case=config.vocabulary.do_lower_case,
                         extra_files={REPORT_FILE: json.dumps(report, indent=2) + "\n"})


def _tokenize(texts: Sequence[str], vocabulary: Sequence[str],
              config: PretrainConfig) -> np.ndarray:
    """`[N, max_sequence_length]` int32 ids: `[CLS] … [SEP]`, `[PAD]` after."""
    import tensorflow as tf

    from ampflow.modeling.wordpiece import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(vocabulary, do_lower_case=config.vocabulary.do_lower_case,
                                   sequence_length=config.max_sequence_length)
    # small batches: the tokenizer's candidate pieces are [words, width, longest piece]
    return np.concatenate([tokenizer(tf.constant(list(texts[i:i + _BATCH])))["token_ids"].numpy()
                           for i in range(0, len(texts), _BATCH)])


def _fit(model, token_ids: np.ndarray, vocabulary: Sequence[str], config: PretrainConfig,
         steps: int) -> list[float]:
    """Each epoch masked anew (dynamic masking); the mean masked-LM loss of each epoch."""
    import keras
    import tensorflow as tf

    from ampflow.modeling.fine_tuning import FineTuneOptimizerConfig, fine_tune_optimizer
    from ampflow.modeling.mlm import gather_predictions, mask_tokens

    ids = {token: i for i, token in enumerate(vocabulary)}
    special = [ids[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
    optimizer = fine_tune_optimizer(FineTuneOptimizerConfig(learning_rate=config.learning_rate),
                                    steps * config.epochs)
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(config.seed)
    losses = []
    for epoch in range(config.epochs):
        order = rng.permutation(len(token_ids))
        rows = np.resize(order, steps * config.batch_size)  # wraps when steps ask for more
        masked = mask_tokens(token_ids[rows], rng, special_ids=special, mask_id=ids["[MASK]"],
                             vocab_size=len(vocabulary), rate=config.mask_rate,
                             max_predictions=config.max_predictions)
        positions, labels, weights = gather_predictions(masked.labels, config.max_predictions)
        weights = _per_masked_token(weights, config.batch_size)
        inputs = {"token_ids": masked.token_ids, "segment_ids": np.zeros_like(masked.token_ids),
                  "positions": positions}
        data = tf.data.Dataset.from_tensor_slices((inputs, labels, weights)).batch(
            config.batch_size)
        history = model.fit(data, initial_epoch=epoch, epochs=epoch + 1, verbose=0)
        losses.append(round(float(history.history["loss"][-1]), 4))
    return losses


def _per_masked_token(weights: np.ndarray, batch_size: int) -> np.ndarray:
    """Weights scaled per batch so Keras's mean over `[batch, P]` is the mean per masked token.

    Keras divides a weighted loss by the number of entries, padding entries included; scaled
    so, the loss logged is BERT's `masked_lm_loss` (per masked token) whatever the padding.
    """
    scaled = weights.copy()
    for start in range(0, len(weights), batch_size):
        chunk = scaled[start:start + batch_size]
        chunk *= chunk.size / max(chunk.sum(), 1.0)
    return scaled


def _jsonable(config: PretrainConfig) -> dict:
    return json.loads(json.dumps(asdict(config)))
