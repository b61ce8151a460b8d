"""BERT's tokenizer in core TensorFlow ops against `tokenizers`' BertWordPieceTokenizer.

The reference reads the same vocab.txt; the sentences carry accents, non-Latin scripts (with
their combining marks), punctuation, unknown words, control characters, Unicode spaces, a word
over 100 characters and long texts. Then: the same ids in `tf.data.Dataset.map` and a traced
`tf.function`, a graph of core ops only, and a SavedModel that tokenizes after loading.
"""

from __future__ import annotations

import re
import string

import numpy as np
import pytest
import tensorflow as tf
from hf_bert_files import VOCABULARY
from tokenizers import BertWordPieceTokenizer

from ampflow.errors import ConfigError
from ampflow.modeling.wordpiece import WordPieceTokenizer

EXTRA = (list(string.ascii_uppercase) + [f"##{c}" for c in string.ascii_uppercase]
         + ["é", "##é", "ü", "##ü", "Über", "Café", "##ç", "##ी", "न", "##म", "ᄒ", "##ᅡ", "##ᆫ",
            "$", "¿", "¡", "…", "—", "ひ", "##ら", "カ", "مرحبا", "##ال", "Ω", "##mega"])
VOCAB = VOCABULARY + EXTRA
SENTENCES = [
    "The movie was unbelievable, really!",
    "Café naïve RÉSUMÉ über Ångström, crème brûlée à la carte; Çà et là.",
    "Привет, мир! 中文日本語 ひらがな カタカナ 한국어 안녕하세요",
    "مرحبا بالعالم — Ελληνικά ΣΟΦΙΑ · สวัสดี नमस्ते हिन्दी",
    "Hello,world!!! (really?) \"quoted\" it's — dash… ¿qué? ¡sí! $5+3=8 ^_^ @user #tag",
    "xyzzy ωmega Ωmega 🙂 emoji ☃ unknown-words",
    "tab\there\nnew\r\nline\u00a0nbsp\u200bzero\u2028width\x00nul\x07bell\ufeffbom",
    "a" * 101 + " " + "b" * 100 + " end",
    "",
    "   ",
    " ".join(["the movie was good and the film was very bad"] * 30),
]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("".join(f"{t}\n" for t in VOCAB), "utf-8")
    return path


def _reference(vocab_file, lower_case: bool) -> BertWordPieceTokenizer:
    return BertWordPieceTokenizer(str(vocab_file), lowercase=lower_case)


@pytest.fixture(scope="module")
def tokenizers():
    return {lower: WordPieceTokenizer(VOCAB, do_lower_case=lower, sequence_length=64)
            for lower in (True, False)}


@pytest.mark.parametrize("lower_case", [True, False], ids=["uncased", "cased"])
def test_pieces_equal_the_reference_on_every_sentence(vocab_file, tokenizers, lower_case):
    reference = _reference(vocab_file, lower_case)
    got = tokenizers[lower_case].tokenize(SENTENCES).to_list()
    for sentence, ids in zip(SENTENCES, got, strict=True):
        want = reference.encode(sentence, add_special_tokens=False).ids
        assert ids == want, (sentence[:60], [VOCAB[i] for i in ids][:20],
                             [VOCAB[i] for i in want][:20])
    assert any(1 in ids for ids in got) and any(len(ids) > 62 for ids in got)  # [UNK], long


@pytest.mark.parametrize("lower_case", [True, False], ids=["uncased", "cased"])
def test_packed_ids_equal_the_reference_truncated_and_padded(vocab_file, tokenizers,
                                                             lower_case):
    reference = _reference(vocab_file, lower_case)
    reference.enable_truncation(64)
    reference.enable_padding(length=64, pad_id=0, pad_token="[PAD]")
    got = tokenizers[lower_case](SENTENCES)
    want = reference.encode_batch(SENTENCES)
    np.testing.assert_array_equal(got["token_ids"].numpy(), [e.ids for e in want])
    np.testing.assert_array_equal(got["segment_ids"].numpy(), [e.type_ids for e in want])
    assert got["token_ids"].dtype == tf.int32 and got["token_ids"].shape == (len(SENTENCES), 64)


def test_the_same_ids_in_tf_data_and_a_traced_function(tokenizers):
    tokenizer = tokenizers[True]
    eager = tokenizer(SENTENCES)["token_ids"].numpy()
    dataset = tf.data.Dataset.from_tensor_slices(SENTENCES).batch(4).map(tokenizer)
    mapped = np.concatenate([batch["token_ids"].numpy() for batch in dataset])
    np.testing.assert_array_equal(mapped, eager)
    one_by_one = tf.data.Dataset.from_tensor_slices(SENTENCES).map(tokenizer).batch(4)
    mapped = np.concatenate([batch["token_ids"].numpy() for batch in one_by_one])
    np.testing.assert_array_equal(mapped, eager)
    traced = tf.function(tokenizer, input_signature=[tf.TensorSpec([None], tf.string)])
    np.testing.assert_array_equal(traced(tf.constant(SENTENCES))["token_ids"].numpy(), eager)


def _op_types(graph_def) -> set[str]:
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types |= {node.op for node in function.node_def}
    return types


def test_the_graph_holds_only_core_ops_and_a_saved_model_tokenizes_after_loading(
        tokenizers, tmp_path):
    tokenizer = tokenizers[True]
    module = tf.Module()
    module.tokenizer = tokenizer
    module.serve = tf.function(lambda texts: tokenizer(texts),
                               input_signature=[tf.TensorSpec([None], tf.string)])
    graph_def = module.serve.get_concrete_function().graph.as_graph_def()
    ops = _op_types(graph_def)
    assert {"UnicodeDecode", "LookupTableFindV2", "Substr"} <= ops
    assert sorted(op for op in ops if not hasattr(tf.raw_ops, op)) == []
    assert not ops & {"CaseFoldUTF8", "FastWordpieceTokenizeWithOffsets",
                      "RegexSplitWithOffsets", "WordpieceTokenizeWithOffsets"}

    tf.saved_model.save(module, str(tmp_path / "1"),
                        signatures={"serving_default": module.serve})
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel.FromString((tmp_path / "1" / "saved_model.pb")
                                                  .read_bytes())
    saved_ops = set().union(*(_op_types(m.graph_def) for m in saved.meta_graphs))
    assert sorted(op for op in saved_ops if not hasattr(tf.raw_ops, op)) == []
    loaded = tf.saved_model.load(str(tmp_path / "1"))
    out = loaded.signatures["serving_default"](texts=tf.constant(SENTENCES))
    np.testing.assert_array_equal(out["token_ids"].numpy(),
                                  tokenizer(SENTENCES)["token_ids"].numpy())


def test_a_word_longer_than_max_chars_per_word_is_one_unk():
    tokenizer = WordPieceTokenizer(VOCAB, do_lower_case=True, sequence_length=16,
                                   max_chars_per_word=5)
    pieces = tokenizer.tokenize(["movie movies unbelievable"]).to_list()[0]
    assert [VOCAB[i] for i in pieces] == ["movie", "[UNK]", "[UNK]"]
    wide = WordPieceTokenizer(VOCAB, do_lower_case=True, sequence_length=16,
                              max_chars_per_word=300)
    long_word = "ab" * 100  # 200 characters: 200 pieces, past 128 (the doubling's 8 bits)
    assert [VOCAB[i] for i in wide.tokenize([long_word]).to_list()[0]] == (
        ["a", "##b"] + ["##a", "##b"] * 99)


def test_a_special_token_written_in_a_sentence_is_text(tokenizers):
    pieces = tokenizers[True].tokenize(["a [SEP] b [CLS]"]).to_list()[0]
    # ("[" and "]" are not in the test's vocabulary: each is an [UNK] of its own)
    assert [VOCAB[i] for i in pieces] == ["a", "[UNK]", "s", "##e", "##p", "[UNK]", "b",
                                          "[UNK]", "c", "##l", "##s", "[UNK]"]


def test_a_repeated_token_keeps_its_last_id_as_the_reference_does(tmp_path):
    vocab = [*VOCABULARY, "movie"]  # "movie" again, with the last id
    path = tmp_path / "vocab.txt"
    path.write_text("".join(f"{t}\n" for t in vocab), "utf-8")
    ours = WordPieceTokenizer(vocab, do_lower_case=True, sequence_length=8)
    theirs = BertWordPieceTokenizer(str(path), lowercase=True).encode("the movie").ids
    assert ours(["the movie"])["token_ids"].numpy()[0].tolist()[:4] == theirs
    assert len(vocab) - 1 in theirs


@pytest.mark.parametrize("vocabulary,length,message", [
    (VOCABULARY, 1, re.escape("sequence_length must be an integer >= 2 ([CLS] and [SEP]). "
                              "Received: sequence_length=1")),
    (VOCABULARY[1:], 8, r"without \['\[PAD\]'\]"),
])
def test_a_bad_setting_is_one_line(vocabulary, length, message):
    with pytest.raises(ConfigError, match=message):
        WordPieceTokenizer(vocabulary, do_lower_case=True, sequence_length=length)
