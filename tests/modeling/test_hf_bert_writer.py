"""The Hugging Face BERT writer: what it writes, the reader (and the reference reader) reads back.

Every tensor bit for bit through `read_hf_bert`, and through the `safetensors` package (the
reference reader, not ampflow's); an encoder's own variables through `load_hf_bert`; and what
the reader would refuse is refused before anything is written.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import safetensors.numpy
from hf_bert_files import VOCABULARY, bert_shapes

from ampflow.errors import ModelConfigError
from ampflow.modeling.hf_bert import BertConfig, read_hf_bert
from ampflow.modeling.hf_bert_writer import encoder_tensors, write_hf_bert

CONFIG = BertConfig(vocab_size=len(VOCABULARY), hidden_size=16, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=32, max_position_embeddings=24)


def _random_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    # the test's own spelling of BertModel's names and shapes, not the reader's
    shapes = bert_shapes(len(VOCABULARY), 16, 2, 32, 24, 2)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def test_every_tensor_reads_back_bit_for_bit(tmp_path):
    tensors = _random_tensors()
    directory = write_hf_bert(tmp_path / "ckpt", CONFIG, VOCABULARY, tensors,
                              do_lower_case=False, extra_files={"made.json": "{}"})
    checkpoint = read_hf_bert(directory)
    assert checkpoint.config == CONFIG
    assert checkpoint.vocabulary == tuple(VOCABULARY)
    assert (checkpoint.do_lower_case, checkpoint.set_aside) == (False, ())
    assert checkpoint.tensors.keys() == tensors.keys()
    reference = safetensors.numpy.load_file(directory / "model.safetensors")
    for name, value in tensors.items():
        assert checkpoint.tensors[name].tobytes() == value.tobytes(), name
        assert reference[name].tobytes() == value.tobytes(), name
    config = json.loads((directory / "config.json").read_text())
    assert (config["model_type"], config["pad_token_id"]) == ("bert", 0)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_an_encoders_variables_round_trip_through_the_layout(tmp_path):
    import keras

    from ampflow.modeling.bert import bert_encoder, load_hf_bert

    keras.utils.set_random_seed(1)
    encoder = bert_encoder(CONFIG)
    directory = write_hf_bert(tmp_path / "ckpt", CONFIG, VOCABULARY,
                              encoder_tensors(encoder, CONFIG), do_lower_case=True)
    loaded, _ = load_hf_bert(directory)
    assert len(loaded.weights) == len(encoder.weights)
    for mine, theirs in zip(encoder.weights, loaded.weights, strict=True):
        assert np.asarray(mine).tobytes() == np.asarray(theirs).tobytes(), mine.path


@pytest.mark.parametrize(("spoil", "says"), [
    (lambda t, v: (t, v[:-1]), "tokens (vocab_size)"),
    (lambda t, v: (t, [v[1], v[0], *v[2:]]), "Expected [PAD] first"),
    (lambda t, v: ({k: x for k, x in t.items() if "pooler" not in k}, v),
     "Expected exactly the encoder's"),
    (lambda t, v: ({**t, "pooler.dense.bias": np.zeros(3, np.float32)}, v), "pooler.dense.bias"),
])
def test_what_the_reader_would_refuse_is_refused_and_nothing_is_written(tmp_path, spoil, says):
    tensors, vocabulary = spoil(_random_tensors(), list(VOCABULARY))
    with pytest.raises(ModelConfigError, match=re.escape(says)):
        write_hf_bert(tmp_path / "ckpt", CONFIG, vocabulary, tensors, do_lower_case=True)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_is_not_overwritten(tmp_path):
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(ModelConfigError, match="exists; remove it"):
        write_hf_bert(tmp_path / "ckpt", CONFIG, VOCABULARY, _random_tensors(),
                      do_lower_case=True)
    assert list((tmp_path / "ckpt").iterdir()) == []
