"""A BERT preset in keras-hub's layout, read into the same `HfBertCheckpoint` as Hugging Face's.

The directory `BertBackbone.save_to_preset` + `BertTokenizer.save_to_preset` write (and Kaggle
serves): `config.json` (`registered_name: keras_hub>BertBackbone`, the sizes), `model.weights.h5`
(Keras 3's weights file of the backbone), `tokenizer.json` (casing), the vocabulary at
`assets/tokenizer/vocabulary.txt`, `metadata.json` (versions; not needed to load). Read with
h5py alone: keras-hub is not a dependency (its import pulls tensorflow-text's ops, which the
exported graph must not need). Each tensor is turned into Hugging Face's name and `[out, in]`
layout by transposes and reshapes only, so `assign_hf_weights` puts it into the same encoder
bit for bit. keras-hub computes BERT with the tanh GELU: the config says `gelu_new`. Every way a
preset can be wrong is one `ModelConfigError` line naming the file and the fix (exit 2).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ampflow.errors import ModelConfigError
from ampflow.modeling.hf_bert import (
    BertConfig,
    HfBertCheckpoint,
    expected_shapes,
    read_json_object,
    read_vocabulary,
)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
TOKENIZER_FILE = "tokenizer.json"
VOCAB_FILE = "assets/tokenizer/vocabulary.txt"
METADATA_FILE = "metadata.json"
BACKBONE = "keras_hub>BertBackbone"
TOKENIZER = "keras_hub>BertTokenizer"
BFLOAT16 = "bfloat16"  # Keras 3 writes bfloat16 as 2 opaque bytes with this `dtype` attribute
LAYER_NORM_EPS = 1e-12  # BertBackbone's, fixed in its code (not in config.json)
DOWNLOAD_HINT = ("download the whole preset, e.g. `kagglehub.model_download("
                 "'keras/bert/keras/bert_tiny_en_uncased')`")

# The backbone's layers with weights (their names), and the group Keras 3 gives each in the
# weights file when its `vars` carry no name: the class name in snake case, numbered by order.
TOP_GROUPS = {"token_embedding": "reversible_embedding",
              "position_embedding": "position_embedding",
              "segment_embedding": "embedding",
              "embeddings_layer_norm": "layer_normalization",
              "pooled_dense": "dense"}
# Inside a TransformerEncoder's group: its attributes, the Hugging Face name of each
ENCODER_PARTS = {"_self_attention_layer/query_dense": "attention.self.query",
                 "_self_attention_layer/key_dense": "attention.self.key",
                 "_self_attention_layer/value_dense": "attention.self.value",
                 "_self_attention_layer/output_dense": "attention.output.dense",
                 "_self_attention_layer_norm": "attention.output.LayerNorm",
                 "_feedforward_intermediate_dense": "intermediate.dense",
                 "_feedforward_output_dense": "output.dense",
                 "_feedforward_layer_norm": "output.LayerNorm"}


def is_keras_hub_preset(directory: Path) -> bool:
    """Whether `directory/config.json` is a keras-hub backbone's config (any model family)."""
    try:
        raw = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(raw, dict) and str(raw.get("registered_name", "")).startswith("keras_hub>")


def read_keras_hub_bert(directory: str | os.PathLike) -> HfBertCheckpoint:
    """The preset in `directory`, every tensor by its Hugging Face name, checked."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelConfigError(f"Expected a keras-hub preset directory. Received: {directory} is "
                               f"not a directory; {DOWNLOAD_HINT}")
    config = _read_config(directory / CONFIG_FILE)
    do_lower_case = _read_tokenizer(directory / TOKENIZER_FILE)
    vocabulary = _vocabulary(directory / VOCAB_FILE)
    tensors, set_aside = _read_weights(directory / WEIGHTS_FILE, config)
    if (directory / METADATA_FILE).exists():
        # informational, but a broken one is a bad copy
        read_json_object(directory / METADATA_FILE, _missing)
    if len(vocabulary) != config.vocab_size:
        raise ModelConfigError(
            f"{directory / VOCAB_FILE}: expected {config.vocab_size} tokens, one per row of the "
            f"token embedding in {WEIGHTS_FILE} (vocabulary_size in {CONFIG_FILE}). Received: "
            f"{len(vocabulary)} tokens; use the vocabulary the preset was saved with")
    return HfBertCheckpoint(directory, config, vocabulary, do_lower_case, TOKENIZER_FILE,
                            tensors, set_aside, layout="keras-hub")


def _read_config(path: Path) -> BertConfig:
    raw = read_json_object(path, _missing)
    if raw.get("registered_name") != BACKBONE:
        raise ModelConfigError(
            f"{path}: expected registered_name {BACKBONE!r}. Received: registered_name="
            f"{raw.get('registered_name')!r}; only keras-hub's BERT presets are read so far")
    sizes = raw.get("config")
    names = ("vocabulary_size", "num_layers", "num_heads", "hidden_dim", "intermediate_dim")
    if not isinstance(sizes, dict) or any(name not in sizes for name in names):
        raise ModelConfigError(f"{path}: expected a config object with {list(names)}. Received: "
                               f"{sorted(sizes) if isinstance(sizes, dict) else sizes!r}")
    dropout = sizes.get("dropout", 0.1)
    try:
        return BertConfig(
            vocab_size=sizes["vocabulary_size"], hidden_size=sizes["hidden_dim"],
            num_hidden_layers=sizes["num_layers"], num_attention_heads=sizes["num_heads"],
            intermediate_size=sizes["intermediate_dim"], hidden_act="gelu_new",
            hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
            max_position_embeddings=sizes.get("max_sequence_length", 512),
            type_vocab_size=sizes.get("num_segments", 2), layer_norm_eps=LAYER_NORM_EPS)
    except ValueError as e:
        raise ModelConfigError(f"{path}: {e}") from e


def _read_tokenizer(path: Path) -> bool:
    """The casing: `lowercase`, as BERT's uncased tokenizer applies it (accents stripped too)."""
    raw = read_json_object(path, _missing)
    if raw.get("registered_name") != TOKENIZER:
        raise ModelConfigError(f"{path}: expected registered_name {TOKENIZER!r}. Received: "
                               f"registered_name={raw.get('registered_name')!r}")
    settings = raw.get("config") if isinstance(raw.get("config"), dict) else {}
    lowercase = settings.get("lowercase", False)  # BertTokenizer's default
    if not isinstance(lowercase, bool):
        raise ModelConfigError(
            f"{path}: expected lowercase true or false. Received: lowercase={lowercase!r}")
    wanted = {"suffix_indicator": "##", "oov_token": "[UNK]", "split": True}
    for key, value in wanted.items():
        if settings.get(key, value) != value:
            raise ModelConfigError(f"{path}: expected {key}={value!r} (BERT's WordPiece). "
                                   f"Received: {key}={settings[key]!r}")
    if settings.get("strip_accents") and not lowercase:
        raise ModelConfigError(f"{path}: expected accents stripped only with lowercase (BERT's "
                               "uncased tokenizer). Received: strip_accents=true, "
                               "lowercase=false")
    return lowercase


def _vocabulary(path: Path) -> tuple[str, ...]:
    if not path.exists():
        raise _missing(path)
    return read_vocabulary(path)


def _read_weights(path: Path, config: BertConfig) -> tuple[dict[str, np.ndarray],
                                                           tuple[str, ...]]:
    """Every encoder tensor by Hugging Face name (float32, `[out, in]`), and the rest's paths."""
    import h5py

    if not path.exists():
        raise _missing(path)
    try:
        file = h5py.File(path, "r")
    except OSError as e:
        raise ModelConfigError(f"{path}: expected a Keras 3 weights file (HDF5). Received: a "
                               f"file HDF5 cannot open ({e}); download it again") from e
    with file:
        datasets = _datasets(file)
        groups = _layer_groups(file, config.num_hidden_layers)
        raw = {}
        for name, (group, index) in _sources(config).items():
            dataset = f"{groups[group]}/vars/{index}"
            if dataset not in datasets:
                raise ModelConfigError(
                    f"{path}: expected the dataset {dataset} ({group}'s weight {index}, for "
                    f"{name}). Received: no such dataset among {len(datasets)}; the weights and "
                    f"{CONFIG_FILE} must come from the same preset")
            raw[name] = (dataset, _array(file[dataset]))
        set_aside = sorted(set(datasets) - {dataset for dataset, _ in raw.values()})
    return {name: _to_hugging_face(path, dataset, value, name, config)
            for name, (dataset, value) in raw.items()}, tuple(set_aside)


def _array(dataset) -> np.ndarray:
    """The dataset's values; Keras's bfloat16 (2 opaque bytes, `dtype` attribute) widened."""
    value = dataset[()]
    if _text(dataset.attrs.get("dtype", "")) == BFLOAT16 and value.dtype.itemsize == 2:
        return (np.asarray(value).view("<u2").astype(np.uint32) << 16).view(np.float32)
    return value


def _datasets(file) -> set[str]:
    found = set()
    file.visititems(lambda name, obj: found.add(name) if hasattr(obj, "shape") else None)
    return found


def _layer_groups(file, num_layers: int) -> dict[str, str]:
    """Each layer's group: by the name its `vars` carry, else by Keras 3's class-name path."""
    named = {}
    for key, group in file.get("layers", {}).items():
        if "vars" in group and "name" in group["vars"].attrs:
            named[_text(group["vars"].attrs["name"])] = f"layers/{key}"
    groups = {}
    for layer, default in TOP_GROUPS.items():
        groups[layer] = named.get(layer, f"layers/{default}")
    for n in range(num_layers):
        encoder = named.get(f"transformer_layer_{n}",
                            f"layers/transformer_encoder{f'_{n}' if n else ''}")
        for part in ENCODER_PARTS:
            groups[f"transformer_layer_{n}/{part}"] = f"{encoder}/{part}"
    return groups


def _sources(config: BertConfig) -> dict[str, tuple[str, int]]:
    """Hugging Face name → (the layer it is a weight of, its index among the layer's vars)."""
    sources = {"embeddings.word_embeddings.weight": ("token_embedding", 0),
               "embeddings.position_embeddings.weight": ("position_embedding", 0),
               "embeddings.token_type_embeddings.weight": ("segment_embedding", 0),
               "embeddings.LayerNorm.weight": ("embeddings_layer_norm", 0),
               "embeddings.LayerNorm.bias": ("embeddings_layer_norm", 1),
               "pooler.dense.weight": ("pooled_dense", 0),
               "pooler.dense.bias": ("pooled_dense", 1)}
    for n in range(config.num_hidden_layers):
        for part, name in ENCODER_PARTS.items():
            for index, leaf in enumerate(("weight", "bias")):
                sources[f"encoder.layer.{n}.{name}.{leaf}"] = (
                    f"transformer_layer_{n}/{part}", index)
    return sources


def keras_shape(name: str, config: BertConfig) -> tuple[int, ...]:
    """The shape keras-hub's variable for Hugging Face's tensor `name` has.

    Dense kernels are `[in, out]`; the attention's `EinsumDense` kernels `[in, heads, head]`
    (query, key, value) and `[heads, head, out]` (output), their biases `[heads, head]`.
    """
    shape = expected_shapes(config)[name]
    split = (config.num_attention_heads, config.head_size)
    if ".attention.self." in name:
        return (shape[1], *split) if name.endswith(".weight") else split
    if ".attention.output.dense.weight" in name:
        return (*split, shape[0])
    if _is_kernel(name):
        return (shape[1], shape[0])
    return shape


def _is_kernel(name: str) -> bool:
    """A Linear weight (`[out, in]` in Hugging Face's file, a transposed kernel in Keras)."""
    return name.endswith(".weight") and "embeddings" not in name and "LayerNorm" not in name


def _to_hugging_face(path: Path, dataset: str, value: np.ndarray, name: str,
                     config: BertConfig) -> np.ndarray:
    """keras-hub's variable as Hugging Face's tensor: reshaped and transposed, nothing rounded."""
    want = keras_shape(name, config)
    if value.dtype.kind != "f" or tuple(value.shape) != want:
        raise ModelConfigError(
            f"{path}: expected {dataset} to be a float tensor of shape {list(want)} "
            f"({CONFIG_FILE}'s sizes). Received: {value.dtype} {list(value.shape)}; the weights "
            f"and {CONFIG_FILE} must come from the same preset")
    shape = expected_shapes(config)[name]
    value = value.astype(np.float32)  # float16 (bfloat16 already) widens exactly
    if not _is_kernel(name):
        return value.reshape(shape)  # an attention bias [heads, head] → [hidden]; others as is
    return np.ascontiguousarray(value.reshape(shape[1], shape[0]).T)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _missing(path: Path) -> ModelConfigError:
    return ModelConfigError(f"{path}: expected {path.name} in the keras-hub preset directory. "
                            f"Received: no such file; {DOWNLOAD_HINT}")
