"""Raw sentences through a checkpoint's own tokenizer and encoder, in process and as a SavedModel.

The groundwork of issue 48's export: a signature that takes raw sentences, tokenizes with the
checkpoint's vocabulary and casing in core ops, and runs the encoder, saved and loaded back
with the same outputs and no op outside `tf.raw_ops`.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from hf_bert_files import write_hf_bert
from numpy_bert import numpy_bert, tolerance
from tokenizers import BertWordPieceTokenizer

from ampflow.errors import ModelConfigError
from ampflow.modeling.bert import load_hf_bert
from ampflow.modeling.hf_bert import read_hf_bert
from ampflow.modeling.wordpiece import checkpoint_tokenizer

POSITIONS = 32
SENTENCES = ["The movie was unbelievable!", "Café: not bad, naïve and great.",
             "привет мир 中文", "xyzzy " * 20]


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert_text")
    return directory, write_hf_bert(directory, positions=POSITIONS)


def test_a_sequence_past_the_position_table_is_one_line_naming_config_json(checkpoint_dir):
    directory, _ = checkpoint_dir
    checkpoint = read_hf_bert(directory)
    assert checkpoint_tokenizer(checkpoint, POSITIONS).sequence_length == POSITIONS
    with pytest.raises(ModelConfigError) as caught:
        checkpoint_tokenizer(checkpoint, POSITIONS + 1)
    assert str(caught.value) == (
        f"sequence_length must be at most {POSITIONS}, the max_position_embeddings of "
        f"{directory / 'config.json'}. Received: sequence_length={POSITIONS + 1}")
    assert caught.value.exit_code == 2


def test_sentences_give_the_references_ids_and_the_numpy_berts_outputs(checkpoint_dir):
    directory, written = checkpoint_dir
    keras.mixed_precision.set_global_policy("float32")
    encoder, checkpoint = load_hf_bert(directory)
    inputs = checkpoint_tokenizer(checkpoint, POSITIONS)(SENTENCES)
    reference = BertWordPieceTokenizer(str(directory / "vocab.txt"), lowercase=True)
    reference.enable_truncation(POSITIONS)
    reference.enable_padding(length=POSITIONS)
    ids = np.array([e.ids for e in reference.encode_batch(SENTENCES)], np.int32)
    np.testing.assert_array_equal(inputs["token_ids"].numpy(), ids)
    want, want_pooled = numpy_bert(written, ids, np.zeros_like(ids), heads=4)
    got = encoder(inputs)
    for key, expected in (("sequence_output", want), ("pooled_output", want_pooled)):
        error = np.abs(np.asarray(got[key], np.float64) - expected).max()
        assert error <= tolerance("float32", expected, longest_dot=128), key


@pytest.mark.slow  # saves and reloads an encoder's SavedModel: ~10 s
def test_a_saved_model_of_sentences_to_outputs_loads_with_core_ops_only(checkpoint_dir,
                                                                        tmp_path):
    directory, _ = checkpoint_dir
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    encoder, checkpoint = load_hf_bert(directory)
    tokenizer = checkpoint_tokenizer(checkpoint, POSITIONS)
    module = tf.Module()
    module.encoder, module.tokenizer = encoder, tokenizer
    module.serve = tf.function(
        lambda texts: {k: tf.cast(v, tf.float32) for k, v in encoder(tokenizer(texts)).items()},
        input_signature=[tf.TensorSpec([None], tf.string, name="texts")])
    in_process = module.serve(tf.constant(SENTENCES))
    tf.saved_model.save(module, str(tmp_path / "1"), signatures={"serving_default": module.serve})

    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel.FromString((tmp_path / "1" / "saved_model.pb")
                                                  .read_bytes())
    ops = set()
    for meta_graph in saved.meta_graphs:
        ops |= {n.op for n in meta_graph.graph_def.node}
        for function in meta_graph.graph_def.library.function:
            ops |= {n.op for n in function.node_def}
    assert sorted(op for op in ops if not hasattr(tf.raw_ops, op)) == []
    loaded = tf.saved_model.load(str(tmp_path / "1")).signatures["serving_default"]
    out = loaded(texts=tf.constant(SENTENCES))
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_array_equal(out[key].numpy(), in_process[key].numpy())
