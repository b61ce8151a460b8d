"""A BERT preset in keras-hub's layout, written by the tests with h5py from Hugging Face tensors.

The layout is what keras-hub 0.32's `BertBackbone.save_to_preset` and
`BertTokenizer.save_to_preset` wrote for a 2-layer backbone (Keras 3.15): config.json,
tokenizer.json, metadata.json, assets/tokenizer/vocabulary.txt, and model.weights.h5 with a
group per layer of the functional backbone named after its class (`layers/transformer_encoder_1`
…), sub-layers under their attribute names, each layer's variables as `vars/0`, `vars/1` in
creation order and the layer's own name in the `vars` group's `name` attribute. The Hugging
Face → keras-hub conversion here is the test's own (keras-hub's converter, convert_bert.py:
kernels transposed, attention kernels split by head), not ampflow's reader.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import ml_dtypes
import numpy as np

# each Hugging Face tensor of one layer → (the TransformerEncoder's sub-layer, var index)
ENCODER = {"attention.self.query": "_self_attention_layer/query_dense",
           "attention.self.key": "_self_attention_layer/key_dense",
           "attention.self.value": "_self_attention_layer/value_dense",
           "attention.output.dense": "_self_attention_layer/output_dense",
           "attention.output.LayerNorm": "_self_attention_layer_norm",
           "intermediate.dense": "_feedforward_intermediate_dense",
           "output.dense": "_feedforward_output_dense",
           "output.LayerNorm": "_feedforward_layer_norm"}
SUB_LAYER_NAMES = {"_self_attention_layer/query_dense": "query",
                   "_self_attention_layer/key_dense": "key",
                   "_self_attention_layer/value_dense": "value",
                   "_self_attention_layer/output_dense": "attention_output",
                   "_self_attention_layer": "self_attention_layer",
                   "_self_attention_layer/_softmax": "softmax",
                   "_self_attention_layer/_dropout_layer": "dropout",
                   "_self_attention_layer_norm": "self_attention_layer_norm",
                   "_self_attention_dropout": "self_attention_dropout",
                   "_feedforward_intermediate_dense": "feedforward_intermediate_dense",
                   "_feedforward_output_dense": "feedforward_output_dense",
                   "_feedforward_layer_norm": "feedforward_layer_norm",
                   "_feedforward_dropout": "feedforward_dropout"}


def keras_hub_variables(tensors: dict[str, np.ndarray], heads: int) -> dict[str, list]:
    """Group path → the layer's variables in keras-hub's shapes, from Hugging Face tensors."""
    hidden = tensors["embeddings.word_embeddings.weight"].shape[1]
    layers = len({k.split(".")[2] for k in tensors if k.startswith("encoder.layer.")})
    split = (heads, hidden // heads)
    groups = {"layers/reversible_embedding": [tensors["embeddings.word_embeddings.weight"]],
              "layers/position_embedding": [tensors["embeddings.position_embeddings.weight"]],
              "layers/embedding": [tensors["embeddings.token_type_embeddings.weight"]],
              "layers/layer_normalization": [tensors["embeddings.LayerNorm.weight"],
                                             tensors["embeddings.LayerNorm.bias"]],
              "layers/dense": [tensors["pooler.dense.weight"].T, tensors["pooler.dense.bias"]]}
    for n in range(layers):
        encoder = f"layers/transformer_encoder{f'_{n}' if n else ''}"
        for hf, part in ENCODER.items():
            weight, bias = (tensors[f"encoder.layer.{n}.{hf}.{leaf}"] for leaf in ("weight",
                                                                                    "bias"))
            if hf.startswith("attention.self."):
                weight, bias = weight.T.reshape(hidden, *split), bias.reshape(split)
            elif hf == "attention.output.dense":
                weight = weight.T.reshape(*split, hidden)
            elif not hf.endswith("LayerNorm"):
                weight = weight.T
            groups[f"{encoder}/{part}"] = [weight, bias]
    return groups


def layer_names(layers: int) -> dict[str, str]:
    """Group path → the layer's name (the `vars` group's `name` attribute)."""
    names = {"layers/input_layer": "token_ids", "layers/input_layer_1": "segment_ids",
             "layers/input_layer_2": "padding_mask", "layers/reversible_embedding":
             "token_embedding", "layers/position_embedding": "position_embedding",
             "layers/embedding": "segment_embedding", "layers/add": "embeddings_add",
             "layers/layer_normalization": "embeddings_layer_norm",
             "layers/dropout": "embeddings_dropout", "layers/dense": "pooled_dense"}
    for n in range(layers):
        encoder = f"layers/transformer_encoder{f'_{n}' if n else ''}"
        names[encoder] = f"transformer_layer_{n}"
        names.update({f"{encoder}/{part}": name for part, name in SUB_LAYER_NAMES.items()})
    return names


def write_keras_hub_bert(directory: Path, tensors: dict[str, np.ndarray], *, heads: int,
                         vocabulary: list[str], positions: int, types: int = 2,
                         lowercase: bool = True, named_vars: bool = True,
                         dtype=np.float32) -> None:
    """Write the preset of `tensors` (Hugging Face names, as write_hf_bert returns them)."""
    (directory / "assets" / "tokenizer").mkdir(parents=True, exist_ok=True)
    hidden = tensors["embeddings.word_embeddings.weight"].shape[1]
    layers = len({k.split(".")[2] for k in tensors if k.startswith("encoder.layer.")})
    intermediate = tensors["encoder.layer.0.intermediate.dense.bias"].shape[0]
    variables = keras_hub_variables(tensors, heads)
    with h5py.File(directory / "model.weights.h5", "w") as file:
        for path, name in layer_names(layers).items():
            group = file.require_group(f"{path}/vars")
            if named_vars:
                group.attrs["name"] = name
            for index, value in enumerate(variables.get(path, [])):
                dataset = group.create_dataset(str(index), data=np.asarray(value, dtype))
                if dtype == ml_dtypes.bfloat16:  # as Keras 3 writes it: opaque, and marked
                    dataset.attrs["dtype"] = "bfloat16"
        root = file.require_group("vars")
        if named_vars:
            root.attrs["name"] = "bert_backbone"
    policy = {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"},
              "registered_name": None}
    config = {"module": "keras_hub.src.models.bert.bert_backbone", "class_name": "BertBackbone",
              "config": {"name": "bert_backbone", "trainable": True, "dtype": policy,
                         "vocabulary_size": len(vocabulary), "num_layers": layers,
                         "num_heads": heads, "hidden_dim": hidden,
                         "intermediate_dim": intermediate, "dropout": 0.1,
                         "max_sequence_length": positions, "num_segments": types},
              "registered_name": "keras_hub>BertBackbone"}
    tokenizer = {"module": "keras_hub.src.models.bert.bert_tokenizer",
                 "class_name": "BertTokenizer",
                 "config": {"name": "bert_tokenizer", "trainable": True,
                            "dtype": {**policy, "config": {"name": "int32"}},
                            "config_file": "tokenizer.json", "vocabulary": None,
                            "sequence_length": None, "lowercase": lowercase,
                            "strip_accents": False, "split": True, "suffix_indicator": "##",
                            "oov_token": "[UNK]", "special_tokens": None,
                            "special_tokens_in_strings": False},
                 "registered_name": "keras_hub>BertTokenizer"}
    metadata = {"keras_version": "3.15.1", "keras_hub_version": "0.32.0",
                "parameter_count": sum(int(v.size) for v in tensors.values()),
                "date_saved": "2026-12-07@04:48:39",
                "tasks": ["MaskedLM", "TextClassifier", "TextEmbedder"]}
    for name, content in (("config.json", config), ("tokenizer.json", tokenizer),
                          ("metadata.json", metadata)):
        (directory / name).write_text(json.dumps(content, indent=4))
    (directory / "assets" / "tokenizer" / "vocabulary.txt").write_text(
        "".join(f"{t}\n" for t in vocabulary), "utf-8")
