"""keras-hub's BERT preset layout, read by the same loader as Hugging Face's, told apart by itself.

(a) a preset written by the tests (keras_hub_files.py) from the tensors of a Hugging Face
    checkpoint loads every variable bit for bit equal to the Hugging Face load of the same
    weights, and gives the same outputs, which equal a NumPy BERT with keras-hub's tanh GELU;
(b) `load_pretrained_bert` tells the layouts apart; a handle is one line with its download;
(c) a bad preset is one line naming the file and the fix (exit 2).
"""

from __future__ import annotations

import json
import re

import h5py
import keras
import numpy as np
import pytest
from hf_bert_files import VOCABULARY, edit_json, write_hf_bert
from keras_hub_files import write_keras_hub_bert
from numpy_bert import numpy_bert, tolerance

from ampflow.errors import ModelConfigError
from ampflow.modeling.pretrained import load_pretrained_bert, read_pretrained_bert

LAYERS, HIDDEN, HEADS, INTERMEDIATE, POSITIONS = 2, 64, 4, 128, 32
SIZES = dict(layers=LAYERS, hidden=HIDDEN, heads=HEADS, intermediate=INTERMEDIATE,
             positions=POSITIONS)


@pytest.fixture(scope="module")
def both_layouts(tmp_path_factory):
    """The same weights twice: Hugging Face's layout (tanh GELU, as keras-hub's) and a preset."""
    root = tmp_path_factory.mktemp("layouts")
    tensors = write_hf_bert(root / "hf", hidden_act="gelu_new", **SIZES)
    write_keras_hub_bert(root / "preset", tensors, heads=HEADS, vocabulary=VOCABULARY,
                         positions=POSITIONS)
    return root / "hf", root / "preset", tensors


def _inputs():
    rng = np.random.default_rng(7)
    ids = rng.integers(5, len(VOCABULARY), (3, 14)).astype(np.int32)
    ids[:, 0], ids[1, 7:] = 2, 0
    types = np.zeros_like(ids)
    types[0, 6:] = 1
    return {"token_ids": ids, "segment_ids": types}


@pytest.mark.parametrize("policy", ("float32", "mixed_bfloat16", "mixed_float16"))
def test_a_preset_loads_every_tensor_and_output_of_the_hugging_face_load(both_layouts, policy):
    hf_dir, preset_dir, _ = both_layouts
    keras.mixed_precision.set_global_policy(policy)
    from_hf, _ = load_pretrained_bert(hf_dir)
    from_preset, checkpoint = load_pretrained_bert(preset_dir)
    assert checkpoint.layout == "keras-hub" and len(from_preset.weights) == 39
    for mine, theirs in zip(from_preset.weights, from_hf.weights, strict=True):
        assert (mine.path, mine.dtype) == (theirs.path, "float32")
        np.testing.assert_array_equal(mine.numpy().view(np.uint32),
                                      theirs.numpy().view(np.uint32), err_msg=mine.path)
    inputs = _inputs()
    for key, value in from_preset(inputs).items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(from_hf(inputs)[key]))


def test_a_presets_outputs_are_berts_with_keras_hubs_tanh_gelu(both_layouts):
    _, preset_dir, tensors = both_layouts
    keras.mixed_precision.set_global_policy("float32")
    encoder, _ = load_pretrained_bert(preset_dir)
    inputs = _inputs()
    got = encoder(inputs)
    want = numpy_bert(tensors, inputs["token_ids"], inputs["segment_ids"], heads=HEADS,
                      approximate_gelu=True)
    for key, expected in zip(("sequence_output", "pooled_output"), want, strict=True):
        error = np.abs(np.asarray(got[key], np.float64) - expected).max()
        assert error <= tolerance("float32", expected, INTERMEDIATE), (key, error)


@pytest.mark.parametrize("named_vars,dtype", [(False, np.float32), (True, np.float16)])
def test_a_preset_without_layer_names_or_in_float16_reads_exactly(tmp_path, named_vars, dtype):
    """Older Keras 3 files carry no `name` on `vars`: the class-name paths find the layers."""
    tensors = write_hf_bert(tmp_path / "hf", dtype=dtype, **SIZES)
    write_keras_hub_bert(tmp_path / "preset", tensors, heads=HEADS, vocabulary=VOCABULARY,
                         positions=POSITIONS, named_vars=named_vars, dtype=dtype)
    checkpoint = read_pretrained_bert(tmp_path / "preset")
    assert checkpoint.tensors.keys() == tensors.keys()
    for name, value in tensors.items():
        np.testing.assert_array_equal(checkpoint.tensors[name], value, err_msg=name)


def test_a_bfloat16_preset_widens_exactly(tmp_path):
    """Keras 3 stores bfloat16 as 2 opaque bytes marked `dtype: bfloat16`: widened bit-exactly."""
    import ml_dtypes

    tensors = write_hf_bert(tmp_path / "hf", **SIZES)
    write_keras_hub_bert(tmp_path / "preset", tensors, heads=HEADS, vocabulary=VOCABULARY,
                         positions=POSITIONS, dtype=ml_dtypes.bfloat16)
    checkpoint = read_pretrained_bert(tmp_path / "preset")
    for name, value in tensors.items():
        want = value.astype(ml_dtypes.bfloat16).astype(np.float32)
        assert not np.array_equal(want, value), name  # the file really is rounded
        np.testing.assert_array_equal(checkpoint.tensors[name], want, err_msg=name)


def test_the_presets_sizes_vocabulary_and_casing_are_read(tmp_path):
    tensors = write_hf_bert(tmp_path / "hf", layers=3, hidden=48, heads=3, intermediate=96,
                            positions=20, types=3)
    write_keras_hub_bert(tmp_path / "preset", tensors, heads=3, vocabulary=VOCABULARY,
                         positions=20, types=3, lowercase=False)
    checkpoint = read_pretrained_bert(tmp_path / "preset")
    config = checkpoint.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.intermediate_size, config.max_position_embeddings,
            config.type_vocab_size) == (3, 48, 3, 96, 20, 3)
    assert config.hidden_act == "gelu_new" and config.layer_norm_eps == 1e-12
    assert checkpoint.vocabulary == tuple(VOCABULARY)
    assert (checkpoint.do_lower_case, checkpoint.do_lower_case_from) == (False, "tokenizer.json")


def test_the_hugging_face_layout_is_told_apart_and_read_as_before(both_layouts):
    hf_dir, _, _ = both_layouts
    checkpoint = read_pretrained_bert(hf_dir)
    assert checkpoint.layout == "Hugging Face" and checkpoint.config.hidden_act == "gelu_new"


def test_a_presets_tokenizer_is_the_hugging_face_one_of_the_same_vocabulary_and_casing(
        tmp_path):
    """Raw sentences to the same ids from either layout; the position limit names config.json.

    Uncased (the casing read from tokenizer.json: the other test's cased preset shows it).
    """
    lowercase = True
    from tokenizers import BertWordPieceTokenizer

    from ampflow.modeling.wordpiece import checkpoint_tokenizer

    tensors = write_hf_bert(tmp_path / "hf", do_lower_case=lowercase, **SIZES)
    write_keras_hub_bert(tmp_path / "preset", tensors, heads=HEADS, vocabulary=VOCABULARY,
                         positions=POSITIONS, lowercase=lowercase)
    preset = read_pretrained_bert(tmp_path / "preset")
    sentences = ["The movie was unbelievable!", "Café: not bad, naïve.", "привет мир 中文"]
    got = checkpoint_tokenizer(preset, 16)(sentences)
    want = checkpoint_tokenizer(read_pretrained_bert(tmp_path / "hf"), 16)(sentences)
    for key in ("token_ids", "segment_ids"):
        np.testing.assert_array_equal(got[key].numpy(), want[key].numpy())
    reference = BertWordPieceTokenizer(str(tmp_path / "hf" / "vocab.txt"), lowercase=lowercase,
                                       strip_accents=lowercase)
    first = reference.encode(sentences[1]).ids
    np.testing.assert_array_equal(got["token_ids"].numpy()[1, :len(first)], first)
    with pytest.raises(ModelConfigError, match=re.escape(
            f"max_position_embeddings of {tmp_path / 'preset' / 'config.json'}")):
        checkpoint_tokenizer(preset, POSITIONS + 1)


@pytest.mark.parametrize("handle,command", [
    ("hf://google/bert_uncased_L-2_H-128_A-2",
     "`huggingface-cli download google/bert_uncased_L-2_H-128_A-2 --local-dir DIR`"),
    ("kaggle://keras/bert/keras/bert_tiny_en_uncased/3",
     "kagglehub.model_download('keras/bert/keras/bert_tiny_en_uncased/3')")])
def test_a_handle_is_one_line_with_the_command_that_downloads_it(handle, command):
    with pytest.raises(ModelConfigError) as caught:
        read_pretrained_bert(handle)
    message = str(caught.value)
    assert "\n" not in message and command in message and "does not download" in message


def test_a_directory_without_config_json_is_one_line_naming_it(tmp_path):
    with pytest.raises(ModelConfigError) as caught:
        read_pretrained_bert(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path / 'config.json'}: expected config.json, "
                                        "Hugging Face's (model_type bert) or a keras-hub")


# ---- a bad preset: one line naming the file, exit 2 ----------------------------------------

def _rewrite_dataset(path, dataset, value):
    with h5py.File(path, "r+") as file:
        del file[dataset]
        if value is not None:
            file[dataset] = value


def _vars(layer):
    return f"layers/transformer_encoder_1/{layer}/vars"


BAD_PRESETS = {
    "no weights": ("model.weights.h5", lambda d: (d / "model.weights.h5").unlink(),
                   "expected model.weights.h5 in the keras-hub preset directory. Received: no "
                   "such file; download the whole preset"),
    "truncated weights": ("model.weights.h5", lambda d: (d / "model.weights.h5").write_bytes(
        (d / "model.weights.h5").read_bytes()[:-4000]), "HDF5 cannot open"),
    "a missing tensor": ("model.weights.h5", lambda d: _rewrite_dataset(
        d / "model.weights.h5", f"{_vars('_feedforward_output_dense')}/1", None),
        "expected the dataset layers/transformer_encoder_1/_feedforward_output_dense/vars/1"),
    "a misshapen tensor": ("model.weights.h5", lambda d: _rewrite_dataset(
        d / "model.weights.h5", f"{_vars('_self_attention_layer/query_dense')}/0",
        np.zeros((64, 64), np.float32)), "to be a float tensor of shape [64, 4, 16]"),
    "another backbone": ("config.json", lambda d: edit_json(
        d / "config.json", registered_name="keras_hub>GPT2Backbone"),
        "expected registered_name 'keras_hub>BertBackbone'. Received: "
        "registered_name='keras_hub>GPT2Backbone'"),
    "heads do not divide the width": ("config.json", lambda d: edit_json(
        d / "config.json", config={**json.loads((d / "config.json").read_text())["config"],
                                   "num_heads": 5}), "hidden_size must be a multiple"),
    "no vocabulary": ("assets/tokenizer/vocabulary.txt", lambda d: (
        d / "assets/tokenizer/vocabulary.txt").unlink(), "no such file"),
    "vocabulary one short": ("assets/tokenizer/vocabulary.txt", lambda d: (
        d / "assets/tokenizer/vocabulary.txt").write_text("".join(
            f"{t}\n" for t in VOCABULARY[:-1])), f"Received: {len(VOCABULARY) - 1} tokens"),
    "no tokenizer.json": ("tokenizer.json", lambda d: (d / "tokenizer.json").unlink(),
                          "no such file"),
    "casing not a bool": ("tokenizer.json", lambda d: edit_json(d / "tokenizer.json", config={
        **json.loads((d / "tokenizer.json").read_text())["config"], "lowercase": "yes"}),
        "expected lowercase true or false"),
    "another suffix": ("tokenizer.json", lambda d: edit_json(d / "tokenizer.json", config={
        **json.loads((d / "tokenizer.json").read_text())["config"], "suffix_indicator": "@@"}),
        "expected suffix_indicator='##'"),
    "broken metadata": ("metadata.json", lambda d: (d / "metadata.json").write_text("{"),
                        "expected a JSON object. Received: unparsable JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD_PRESETS))
def test_a_bad_preset_is_one_line_naming_the_file(tmp_path, case):
    file, spoil, expected = BAD_PRESETS[case]
    tensors = write_hf_bert(tmp_path / "hf", **SIZES)
    write_keras_hub_bert(tmp_path / "preset", tensors, heads=HEADS, vocabulary=VOCABULARY,
                         positions=POSITIONS)
    spoil(tmp_path / "preset")
    with pytest.raises(ModelConfigError) as caught:
        load_pretrained_bert(tmp_path / "preset")
    message = str(caught.value)
    assert "\n" not in message and expected in message, message
    assert message.startswith(str(tmp_path / "preset" / file)), message
    assert caught.value.exit_code == 2
