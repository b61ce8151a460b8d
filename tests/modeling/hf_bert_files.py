"""A bert-tiny-sized checkpoint in the Hugging Face layout, written by the tests with NumPy.

The tensors are written by the `safetensors` package (the reference writer, not ampflow's), the
names and shapes from Hugging Face's `BertModel` as the test spells them here, independent of
`ampflow.modeling.hf_bert.expected_shapes`. Weights are random at scales that make every part
of the computation matter (Linear weights ~ N(0, 1/in), so attention is far from uniform and
a wrong mask or a swapped projection shows in the outputs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import safetensors.numpy

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "movie", "film", "was", "is", "good", "bad", "great", "not", "very",
         "play", "##ing", "##ed", "##s", "un", "##believ", "##able", "cafe", "naive", "resume",
         "i", "it", "and", "de", "la", "über", "привет", "мир", "中", "文", "日", "本", "ok"]
PUNCTUATION = list(".,!?'\"-()")
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
VOCABULARY = SPECIAL + PUNCTUATION + LETTERS + [f"##{c}" for c in LETTERS] + WORDS


def linear(name: str, inputs: int, outputs: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (outputs, inputs), f"{name}.bias": (outputs,)}


def layer_norm(name: str, size: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (size,), f"{name}.bias": (size,)}


def bert_shapes(vocab: int, hidden: int, layers: int, intermediate: int, positions: int,
                types: int) -> dict[str, tuple[int, ...]]:
    shapes = {"embeddings.word_embeddings.weight": (vocab, hidden),
              "embeddings.position_embeddings.weight": (positions, hidden),
              "embeddings.token_type_embeddings.weight": (types, hidden),
              **layer_norm("embeddings.LayerNorm", hidden)}
    for n in range(layers):
        p = f"encoder.layer.{n}"
        shapes |= linear(f"{p}.attention.self.query", hidden, hidden)
        shapes |= linear(f"{p}.attention.self.key", hidden, hidden)
        shapes |= linear(f"{p}.attention.self.value", hidden, hidden)
        shapes |= linear(f"{p}.attention.output.dense", hidden, hidden)
        shapes |= layer_norm(f"{p}.attention.output.LayerNorm", hidden)
        shapes |= linear(f"{p}.intermediate.dense", hidden, intermediate)
        shapes |= linear(f"{p}.output.dense", intermediate, hidden)
        shapes |= layer_norm(f"{p}.output.LayerNorm", hidden)
    return shapes | linear("pooler.dense", hidden, hidden)


def random_tensor(rng, name: str, shape) -> np.ndarray:
    if "LayerNorm" in name and name.endswith("weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("bias") or "LayerNorm" in name:
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if "embeddings" in name:
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)


def write_hf_bert(directory: Path, *, layers: int = 2, hidden: int = 64, heads: int = 4,
                  intermediate: int = 128, positions: int = 32, types: int = 2,
                  prefix: str = "", old_layer_norm_names: bool = False,
                  do_lower_case: bool | None = True, dtype=np.float32, seed: int = 0,
                  layer_norm_eps: float = 1e-12, hidden_act: str = "gelu",
                  vocabulary: list[str] = VOCABULARY) -> dict[str, np.ndarray]:
    """Write the directory; return the tensors by `BertModel` name, as float32 values."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shapes = bert_shapes(len(vocabulary), hidden, layers, intermediate, positions, types)
    tensors = {name: random_tensor(rng, name, shape).astype(dtype).astype(np.float32)
               for name, shape in shapes.items()}
    in_file = {}
    for name, value in tensors.items():
        if old_layer_norm_names and "LayerNorm" in name:
            name = name.replace(".weight", ".gamma").replace(".bias", ".beta")
        in_file[prefix + name] = value.astype(dtype)
    in_file[prefix + "embeddings.position_ids"] = np.arange(positions, dtype=np.int64)[None]
    if prefix:  # a BertFor* task model's head: not the encoder's
        in_file["classifier.weight"] = rng.standard_normal((2, hidden)).astype(dtype)
        in_file["classifier.bias"] = np.zeros(2, dtype)
    safetensors.numpy.save_file(in_file, directory / "model.safetensors",
                                metadata={"format": "pt"})
    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "intermediate_size": intermediate, "hidden_act": hidden_act,
              "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
              "max_position_embeddings": positions, "type_vocab_size": types,
              "initializer_range": 0.02, "layer_norm_eps": layer_norm_eps,
              "vocab_size": len(vocabulary), "pad_token_id": 0,
              "position_embedding_type": "absolute", "transformers_version": "4.57.0"}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "vocab.txt").write_text("".join(f"{t}\n" for t in vocabulary), "utf-8")
    if do_lower_case is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(
            {"do_lower_case": do_lower_case, "model_max_length": positions,
             "tokenizer_class": "BertTokenizer"}))
    return tensors


def edit_json(path: Path, **changes) -> None:
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


def _rewrite_weights(directory, change):
    path = directory / "model.safetensors"
    tensors = dict(safetensors.numpy.load_file(path))
    change(tensors)
    safetensors.numpy.save_file(tensors, path)


def _truncate(directory):
    path = directory / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


def _short_vocabulary(directory):
    (directory / "vocab.txt").write_text("".join(f"{t}\n" for t in VOCABULARY[:-1]))


def _misshapen(tensors):
    tensors["encoder.layer.1.intermediate.dense.weight"] = np.zeros((128, 63), np.float32)


# every way a directory can be wrong: (the file named, how to spoil it, the message's words)
BAD_DIRECTORIES = {
    "no config.json": ("config.json", lambda d: (d / "config.json").unlink(),
                       "expected config.json in the Hugging Face BERT directory. Received: "
                       "no such file; download the whole repository"),
    "no vocab.txt": ("vocab.txt", lambda d: (d / "vocab.txt").unlink(), "no such file"),
    "no weights": ("model.safetensors", lambda d: (d / "model.safetensors").unlink(),
                   "no such file; download"),
    "only pytorch_model.bin": (
        "model.safetensors",
        lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"),
        "this directory has only pytorch_model.bin: download model.safetensors"),
    "another model_type": ("config.json",
                           lambda d: edit_json(d / "config.json", model_type="distilbert"),
                           "expected model_type 'bert'. Received: model_type='distilbert'"),
    "another activation": ("config.json",
                           lambda d: edit_json(d / "config.json", hidden_act="relu"),
                           "hidden_act must be one of ['gelu', 'gelu_new']"),
    "heads do not divide the width": ("config.json", lambda d: edit_json(
        d / "config.json", num_attention_heads=5),
        "hidden_size must be a multiple of num_attention_heads. Received: hidden_size=64, "
        "num_attention_heads=5"),
    "a size that is no integer": ("config.json", lambda d: edit_json(
        d / "config.json", num_hidden_layers="2"), "Received: num_hidden_layers='2'"),
    "relative positions": ("config.json", lambda d: edit_json(
        d / "config.json", position_embedding_type="relative_key"), "'absolute'"),
    "vocabulary one short": ("vocab.txt", _short_vocabulary,
                             f"expected {len(VOCABULARY)} tokens, one per row of the "
                             f"word-embedding table in model.safetensors. Received: "
                             f"{len(VOCABULARY) - 1} tokens"),
    "no [CLS] in the vocabulary": ("vocab.txt", lambda d: (d / "vocab.txt").write_text(
        "".join(f"{t}\n" for t in VOCABULARY).replace("[CLS]", "[CLASS]")), "without ['[CLS]']"),
    "truncated weights": ("model.safetensors", _truncate, "is not a valid safetensors file"),
    "a missing tensor": ("model.safetensors", lambda d: _rewrite_weights(
        d, lambda t: t.pop("encoder.layer.1.output.dense.bias")),
        "expected the tensor encoder.layer.1.output.dense.bias of shape [64]"),
    "a misshapen tensor": ("model.safetensors", lambda d: _rewrite_weights(d, _misshapen),
                           "expected encoder.layer.1.intermediate.dense.weight to be a float "
                           "tensor of shape [128, 64]"),
    "an integer tensor": ("model.safetensors", lambda d: _rewrite_weights(
        d, lambda t: t.update({"pooler.dense.bias": np.zeros(64, np.int32)})), "int32 [64]"),
    "casing not a bool": ("tokenizer_config.json", lambda d: edit_json(
        d / "tokenizer_config.json", do_lower_case="yes"), "do_lower_case true or false"),
}
