"""A BERT encoder written in the Hugging Face layout, so `--model DIR` reads what was made here.

The writer beside `hf_bert.py`'s reader: `config.json` (`model_type: bert` and the sizes),
`model.safetensors` (every encoder tensor under its `BertModel` name, Linear weights `[out,
in]`, float32), `vocab.txt` (line i = token i) and `tokenizer_config.json` (the casing): what
`BertModel.save_pretrained` plus its tokenizer's `save_pretrained` leave, minus the files the
reader does not need. A checkpoint pretrained here (`ampflow.modeling.mlm`) or an encoder at
its initialization (the from-scratch arm of benchmarks/text_transfer.py) is then fine-tuned
through exactly the code path a downloaded checkpoint takes.

The directory is written beside its destination and renamed into place: a reader never sees a
half-written checkpoint, and an existing directory is not overwritten.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ampflow.errors import ModelConfigError
from ampflow.modeling.hf_bert import (
    CONFIG_FILE,
    MODEL_TYPE,
    SPECIAL_TOKENS,
    TOKENIZER_CONFIG_FILE,
    VOCAB_FILE,
    WEIGHTS_FILE,
    BertConfig,
    expected_shapes,
)
from ampflow.modeling.safetensors import write_safetensors


def encoder_tensors(encoder, config: BertConfig) -> dict[str, np.ndarray]:
    """Every variable of `bert_encoder(config)` by its `BertModel` name, float32, `[out, in]`.

    The inverse of `bert.assign_hf_weights`: a Dense kernel is written transposed.
    """
    from ampflow.modeling.bert import variable_sources

    return {name: np.ascontiguousarray(np.asarray(variable, np.float32).T if transpose
                                       else np.asarray(variable, np.float32))
            for variable, name, transpose in variable_sources(encoder, config)}


def write_hf_bert(directory: str | os.PathLike, config: BertConfig, vocabulary: Sequence[str],
                  tensors: dict[str, np.ndarray], *, do_lower_case: bool,
                  metadata: dict[str, str] | None = None,
                  extra_files: dict[str, str] | None = None) -> Path:
    """Write the checkpoint to `directory` (which must not exist yet); return its path.

    `extra_files` (name → text) are written beside, e.g. how the checkpoint was made; the
    reader ignores them.
    """
    directory = Path(directory)
    _check(directory, config, vocabulary, tensors)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}."))
    try:
        write_safetensors(staging / WEIGHTS_FILE,
                          {name: np.asarray(value, np.float32) for name, value in tensors.items()},
                          {"format": "pt", **(metadata or {})})
        (staging / CONFIG_FILE).write_text(json.dumps(_config_json(config), indent=2) + "\n")
        (staging / VOCAB_FILE).write_text("".join(f"{token}\n" for token in vocabulary),
                                          encoding="utf-8")
        (staging / TOKENIZER_CONFIG_FILE).write_text(json.dumps(
            {"do_lower_case": bool(do_lower_case), "tokenizer_class": "BertTokenizer",
             "model_max_length": config.max_position_embeddings}, indent=2) + "\n")
        for name, text in (extra_files or {}).items():
            (staging / name).write_text(text, encoding="utf-8")
        os.chmod(staging, 0o755)
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def _config_json(config: BertConfig) -> dict:
    """`config.json` as Hugging Face's `BertConfig.to_json_file` names the fields."""
    return {"architectures": ["BertModel"], "model_type": MODEL_TYPE,
            **dataclasses.asdict(config), "pad_token_id": 0,
            "position_embedding_type": "absolute", "initializer_range": 0.02}


def _check(directory: Path, config: BertConfig, vocabulary: Sequence[str],
           tensors: dict[str, np.ndarray]) -> None:
    """What the reader would refuse is refused before anything is written."""
    if directory.exists():
        raise ModelConfigError(f"Expected a new checkpoint directory. Received: {directory} "
                               "exists; remove it or choose another")
    if len(vocabulary) != config.vocab_size:
        raise ModelConfigError(f"Expected {config.vocab_size} tokens (vocab_size), one per row "
                               f"of the word embedding. Received: {len(vocabulary)}")
    if any("\n" in token or "\r" in token or not token for token in vocabulary):
        raise ModelConfigError("Expected tokens without line breaks (vocab.txt is one per "
                               "line). Received: an empty token or one with a line break")
    if vocabulary[0] != "[PAD]" or not set(SPECIAL_TOKENS) <= set(vocabulary):
        raise ModelConfigError(f"Expected [PAD] first (pad_token_id 0) and {list(SPECIAL_TOKENS)}"
                               f" in the vocabulary. Received: {list(vocabulary[:5])}...")
    expected = expected_shapes(config)
    shapes = {name: tuple(np.shape(value)) for name, value in tensors.items()}
    if shapes != expected:
        wrong = sorted(set(shapes.items()) ^ set(expected.items()))[:3]
        raise ModelConfigError(f"Expected exactly the encoder's {len(expected)} tensors of "
                               f"config's sizes. Received: {len(shapes)}, differing at {wrong}")
