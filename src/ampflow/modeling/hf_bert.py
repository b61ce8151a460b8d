"""A BERT checkpoint in the Hugging Face layout, read whole and checked before any model is built.

The layout `huggingface-cli download google/bert_uncased_L-2_H-128_A-2` leaves:
- `config.json`: `model_type: bert` and the sizes (`BertConfig` holds the ones BERT's
  computation needs);
- `model.safetensors`: the tensors, named as `BertModel` names them, or with a `bert.` prefix
  when a `BertFor*` task model saved them (its head's tensors, `cls.*`/`classifier.*`, are not
  the encoder's and are set aside). Older files name LayerNorm's scale and offset
  `gamma`/`beta`. Linear weights are `[out, in]`;
- `vocab.txt`: one WordPiece token per line, line i = id i;
- `tokenizer_config.json`: `do_lower_case` (absent file or key: `True`, the default of
  Hugging Face's `BertTokenizer`; the checkpoint says where its casing came from).

`read_hf_bert(dir)` gives a frozen `HfBertCheckpoint`: the config, the vocabulary, the casing and
every encoder tensor by its canonical name (the `BertModel` name, LayerNorm's as
`weight`/`bias`), float32 (a float16 or bfloat16 file is widened exactly). Every way the
directory can be wrong is one `ModelConfigError` line naming the file and the fix (exit 2).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ampflow.errors import ModelConfigError
from ampflow.modeling.safetensors import read_safetensors

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
VOCAB_FILE = "vocab.txt"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
MODEL_TYPE = "bert"
TASK_PREFIX = "bert."  # BertFor* task models save the encoder under `bert.`
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
# "gelu": the erf GELU of Hugging Face's BERT; "gelu_new": the tanh approximation of Google's
# original BERT code, which keras-hub's BertBackbone computes (hidden_act of a keras-hub preset)
SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new")
DOWNLOAD_HINT = ("download the whole repository, e.g. `huggingface-cli download "
                 "google/bert_uncased_L-2_H-128_A-2 --local-dir DIR`")


@dataclass(frozen=True)
class BertConfig:
    """The sizes of BERT's computation, as `config.json` names them (Hugging Face's defaults)."""

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer. Received: {name}={value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                "hidden_size must be a multiple of num_attention_heads. Received: "
                f"hidden_size={self.hidden_size}, num_attention_heads={self.num_attention_heads}")
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {list(SUPPORTED_ACTIVATIONS)} (BERT's "
                             f"erf GELU or its tanh form). Received: "
                             f"hidden_act={self.hidden_act!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 <= value < 1:
                raise ValueError(f"{name} must be in [0, 1). Received: {name}={value!r}")
        if not isinstance(self.layer_norm_eps, int | float) or not self.layer_norm_eps > 0:
            raise ValueError(
                f"layer_norm_eps must be > 0. Received: layer_norm_eps={self.layer_norm_eps!r}")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def approximate_gelu(self) -> bool:
        """True for the tanh form (`gelu_new`), False for the erf GELU (`gelu`)."""
        return self.hidden_act == "gelu_new"


@dataclass(frozen=True, eq=False)
class HfBertCheckpoint:
    """What a Hugging Face BERT directory holds, checked: all an encoder and its tokenizer need.

    Read once: nothing is read from the directory again later.
    """

    directory: Path
    config: BertConfig
    vocabulary: tuple[str, ...]
    do_lower_case: bool
    do_lower_case_from: str  # "tokenizer_config.json", or why the default was taken
    tensors: dict[str, np.ndarray]  # canonical name -> float32, in the file's [out, in] layout
    set_aside: tuple[str, ...]  # the file's other tensors (a task head's, buffers), by file name
    layout: str = "Hugging Face"  # or "keras-hub" (keras_hub_bert.py reads into this class too)

    @property
    def pad_id(self) -> int:
        return self.vocabulary.index("[PAD]")


def expected_shapes(config: BertConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor BERT's encoder needs, by canonical name, in Hugging Face's layout."""
    h, i = config.hidden_size, config.intermediate_size
    shapes = {"embeddings.word_embeddings.weight": (config.vocab_size, h),
              "embeddings.position_embeddings.weight": (config.max_position_embeddings, h),
              "embeddings.token_type_embeddings.weight": (config.type_vocab_size, h),
              **_layer_norm("embeddings.LayerNorm", h)}
    for n in range(config.num_hidden_layers):
        layer = f"encoder.layer.{n}"
        for part in ("query", "key", "value"):
            shapes.update(_linear(f"{layer}.attention.self.{part}", h, h))
        shapes.update(_linear(f"{layer}.attention.output.dense", h, h))
        shapes.update(_layer_norm(f"{layer}.attention.output.LayerNorm", h))
        shapes.update(_linear(f"{layer}.intermediate.dense", h, i))
        shapes.update(_linear(f"{layer}.output.dense", i, h))
        shapes.update(_layer_norm(f"{layer}.output.LayerNorm", h))
    shapes.update(_linear("pooler.dense", h, h))
    return shapes


def read_hf_bert(directory: str | os.PathLike) -> HfBertCheckpoint:
    """The checkpoint in `directory`, every part checked against the others."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelConfigError(f"Expected a Hugging Face BERT directory. Received: {directory} "
                               f"is not a directory; {DOWNLOAD_HINT}")
    config = _read_config(directory / CONFIG_FILE)
    vocabulary = read_vocabulary(directory / VOCAB_FILE)
    do_lower_case, source = _read_casing(directory / TOKENIZER_CONFIG_FILE)
    tensors, set_aside = _encoder_tensors(directory / WEIGHTS_FILE, config)
    rows = tensors["embeddings.word_embeddings.weight"].shape[0]
    if len(vocabulary) != rows:
        raise ModelConfigError(
            f"{directory / VOCAB_FILE}: expected {rows} tokens, one per row of the "
            f"word-embedding table in {WEIGHTS_FILE}. Received: {len(vocabulary)} tokens; use the "
            "vocab.txt the checkpoint was trained with")
    return HfBertCheckpoint(directory, config, vocabulary, do_lower_case, source, tensors,
                            set_aside)


def _read_config(path: Path) -> BertConfig:
    raw = read_json_object(path, _missing)
    if raw.get("model_type") != MODEL_TYPE:
        raise ModelConfigError(
            f"{path}: expected model_type 'bert'. Received: model_type="
            f"{raw.get('model_type')!r}; only BERT checkpoints are read so far (DistilBERT, "
            "RoBERTa and ELECTRA name their tensors otherwise)")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise ModelConfigError(
            f"{path}: expected position_embedding_type 'absolute' (BERT's learned table). "
            f"Received: position_embedding_type={raw['position_embedding_type']!r}")
    if "vocab_size" not in raw:
        raise ModelConfigError(f"{path}: expected a vocab_size. Received: keys {sorted(raw)}")
    known = {f.name for f in fields(BertConfig)}
    try:
        return BertConfig(**{k: v for k, v in raw.items() if k in known})
    except (TypeError, ValueError) as e:
        raise ModelConfigError(f"{path}: {e}") from e


def read_json_object(path: Path, missing: Callable[[Path], ModelConfigError]) -> dict:
    """A checkpoint's JSON file as a dict; `missing(path)` says how to get an absent one.

    Both layouts' readers take their JSON files here (keras_hub_bert.py with its own hint).
    """
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise missing(path) from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelConfigError(f"{path}: expected a JSON object. Received: unparsable JSON "
                               f"({e})") from e
    if not isinstance(raw, dict):
        raise ModelConfigError(
            f"{path}: expected a JSON object. Received: a {type(raw).__name__}")
    return raw


def read_vocabulary(path: Path) -> tuple[str, ...]:
    """Line i is token i (Hugging Face's `load_vocab`: each line without its newline)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise _missing(path) from e
    except UnicodeDecodeError as e:
        raise ModelConfigError(f"{path}: expected UTF-8 text. Received: {e}") from e
    vocabulary = tuple(line.rstrip("\n").rstrip("\r") for line in text.splitlines(True))
    absent = [token for token in SPECIAL_TOKENS if token not in vocabulary]
    if absent:
        raise ModelConfigError(f"{path}: expected the tokens {list(SPECIAL_TOKENS)}. Received: "
                               f"a vocabulary of {len(vocabulary)} without {absent}")
    return vocabulary


def _read_casing(path: Path) -> tuple[bool, str]:
    if not path.exists():
        return True, f"default: no {TOKENIZER_CONFIG_FILE} (Hugging Face's BertTokenizer's)"
    raw = read_json_object(path, _missing)
    if "do_lower_case" not in raw:
        return True, f"default: {TOKENIZER_CONFIG_FILE} has no do_lower_case"
    if not isinstance(raw["do_lower_case"], bool):
        raise ModelConfigError(f"{path}: expected do_lower_case true or false. Received: "
                               f"do_lower_case={raw['do_lower_case']!r}")
    return raw["do_lower_case"], TOKENIZER_CONFIG_FILE


def _encoder_tensors(path: Path, config: BertConfig) -> tuple[dict[str, np.ndarray],
                                                                tuple[str, ...]]:
    """The encoder's tensors by canonical name (float32), and the names set aside."""
    if not path.exists():
        hint = (" (this directory has only pytorch_model.bin: download model.safetensors, which "
                "most BERT repositories also hold)" if (path.parent / "pytorch_model.bin")
                .exists() else "")
        raise _missing(path, hint)
    raw = read_safetensors(path)
    prefix = TASK_PREFIX if f"{TASK_PREFIX}embeddings.word_embeddings.weight" in raw else ""
    expected = expected_shapes(config)
    tensors, set_aside = {}, []
    for name, array in raw.items():
        canonical = _canonical(name, prefix)
        if canonical in expected:
            tensors[canonical] = (name, array)
        else:
            set_aside.append(name)
    for canonical, shape in expected.items():
        if canonical not in tensors:
            raise ModelConfigError(
                f"{path}: expected the tensor {prefix}{canonical} of shape {list(shape)} "
                f"({CONFIG_FILE}'s sizes). Received: no such tensor among {len(raw)}; the "
                f"weights and {CONFIG_FILE} must come from the same checkpoint")
        name, array = tensors[canonical]
        if array.shape != shape or array.dtype.kind != "f":
            raise ModelConfigError(
                f"{path}: expected {name} to be a float tensor of shape {list(shape)} "
                f"({CONFIG_FILE}'s sizes). Received: {array.dtype} {list(array.shape)}; the "
                f"weights and {CONFIG_FILE} must come from the same checkpoint")
        tensors[canonical] = array.astype(np.float32)  # float16/bfloat16 widen exactly
    return tensors, tuple(sorted(set_aside))


def _canonical(name: str, prefix: str) -> str | None:
    """The `BertModel` name of a file's tensor (None when outside the prefix)."""
    if not name.startswith(prefix):
        return None
    name = name[len(prefix):]
    if ".LayerNorm." in f".{name}":
        name = name.removesuffix(".gamma") + ".weight" if name.endswith(".gamma") else name
        name = name.removesuffix(".beta") + ".bias" if name.endswith(".beta") else name
    return name


def _linear(name: str, inputs: int, outputs: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (outputs, inputs), f"{name}.bias": (outputs,)}


def _layer_norm(name: str, size: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (size,), f"{name}.bias": (size,)}


def _missing(path: Path, hint: str = "") -> ModelConfigError:
    return ModelConfigError(
        f"{path}: expected {path.name} in the Hugging Face BERT directory. Received: no such "
        f"file{hint}; {DOWNLOAD_HINT}")
