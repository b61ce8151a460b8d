"""A Hugging Face BERT directory read whole: sizes, vocabulary, casing and every tensor exact.

Every way the directory can be wrong is one `ModelConfigError` line naming the file (exit 2).
"""

from __future__ import annotations

import numpy as np
import pytest
from hf_bert_files import BAD_DIRECTORIES, VOCABULARY, write_hf_bert

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

@pytest.mark.parametrize("case", sorted(BAD_DIRECTORIES))
def test_a_bad_directory_is_one_line_naming_the_file(tmp_path, case):
    file, spoil, expected = BAD_DIRECTORIES[case]
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
