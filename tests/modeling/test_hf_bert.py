"""A Hugging Face BERT directory read whole: sizes, vocabulary, casing and every tensor exact.

Every way the directory can be wrong is one `ModelConfigError` line naming the file (exit 2).
"""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.numpy
from hf_bert_files import VOCABULARY, edit_json, write_hf_bert

from ampflow.errors import ModelConfigError
from ampflow.modeling.hf_bert import BertConfig, read_hf_bert

TENSORS_PER_LAYER = 16  # q, k, v, attention output, intermediate, output: 6 Linear + 2 LayerNorm


@pytest.mark.parametrize("prefix,old_names,dtype", [
    ("", False, np.float32), ("bert.", False, np.float32), ("", True, np.float32),
    ("bert.", True, np.float16)])
def test_every_tensor_is_read_exactly_by_its_bertmodel_name(tmp_path, prefix, old_names, dtype):
    written = write_hf_bert(tmp_path, layers=2, prefix=prefix, old_layer_norm_names=old_names,
                            dtype=dtype)
    checkpoint = read_hf_bert(tmp_path)
    assert len(checkpoint.tensors) == 5 + 2 * TENSORS_PER_LAYER + 2 == len(written)
    assert sorted(checkpoint.tensors) == sorted(written)
    for name, value in written.items():
        got = checkpoint.tensors[name]
        assert got.dtype == np.float32, name
        np.testing.assert_array_equal(got.view(np.uint32), value.view(np.uint32), err_msg=name)
    expected_aside = [f"{prefix}embeddings.position_ids"]
    if prefix:
        expected_aside += ["classifier.bias", "classifier.weight"]
    assert sorted(checkpoint.set_aside) == sorted(expected_aside)


def test_the_config_vocabulary_and_casing_are_the_files(tmp_path):
    write_hf_bert(tmp_path, layers=3, hidden=48, heads=3, intermediate=96, positions=20,
                  do_lower_case=False)
    checkpoint = read_hf_bert(tmp_path)
    assert checkpoint.config == BertConfig(
        vocab_size=len(VOCABULARY), hidden_size=48, num_hidden_layers=3, num_attention_heads=3,
        intermediate_size=96, max_position_embeddings=20, type_vocab_size=2,
        layer_norm_eps=1e-12)
    assert checkpoint.config.head_size == 16
    assert checkpoint.vocabulary == tuple(VOCABULARY)
    assert checkpoint.pad_id == 0
    assert (checkpoint.do_lower_case, checkpoint.do_lower_case_from) == (
        False, "tokenizer_config.json")


def test_without_tokenizer_config_the_casing_is_hugging_faces_default_and_says_so(tmp_path):
    write_hf_bert(tmp_path, do_lower_case=None)
    checkpoint = read_hf_bert(tmp_path)
    assert checkpoint.do_lower_case is True
    assert checkpoint.do_lower_case_from.startswith("default: no tokenizer_config.json")


# ---- a bad directory: one line naming the file, exit 2 -------------------------------------

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


BAD = {
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
                           lambda d: edit_json(d / "config.json", hidden_act="gelu_new"),
                           "hidden_act must be one of ['gelu']"),
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


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_directory_is_one_line_naming_the_file(tmp_path, case):
    file, spoil, expected = BAD[case]
    write_hf_bert(tmp_path)
    spoil(tmp_path)
    with pytest.raises(ModelConfigError) as caught:
        read_hf_bert(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(tmp_path / file)), message
    assert expected in message
    assert caught.value.exit_code == 2


def test_a_path_that_is_no_directory_is_one_line(tmp_path):
    with pytest.raises(ModelConfigError, match=r"Received: .*/absent is not a directory; "
                                               r"download the whole repository"):
        read_hf_bert(tmp_path / "absent")
