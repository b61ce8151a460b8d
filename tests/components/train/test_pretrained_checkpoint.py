"""`--model DIR`: a pretrained BERT checkpoint, as users download it, through train and after.

The checkpoint is a tiny one in the Hugging Face layout, written by the tests with a WordPiece
vocabulary (letters and `##` letters, so every English word tokenizes, plus the texts' common
words). The run is the shared text folder (tests/tiny_text_model.py) trained from the
checkpoint: its own tokenizer in the model dir, every encoder tensor loaded from the file, the
gate passed, the export's `serving_default` answering raw sentences with the classes the model
gives in process, and the checkpoint's vocabulary among the SavedModel's assets.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "modeling"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hf_bert_files import LETTERS, PUNCTUATION, SPECIAL, write_hf_bert  # noqa: E402
from tiny_text_model import CLASSES, FILLER, KEYWORDS, SEQ, prepared_texts  # noqa: E402

VOCABULARY = (SPECIAL + PUNCTUATION + LETTERS + [f"##{c}" for c in LETTERS] + list(FILLER)
              + [word for name in CLASSES for word in KEYWORDS[name]])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, dict]:
    directory = tmp_path_factory.mktemp("checkpoint") / "bert_uncased_tiny"
    tensors = write_hf_bert(directory, layers=2, hidden=32, heads=2, intermediate=64,
                            positions=128, vocabulary=VOCABULARY, seed=3)
    return directory, tensors


def _cli(*args: str) -> tuple[int, str]:
    from ampflow.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(args))
    return code, out.getvalue()


def test_the_classifier_holds_every_encoder_tensor_of_the_checkpoint(checkpoint):
    from ampflow.modeling.bert import load_hf_bert
    from ampflow.modeling.models import make_text_model
    from ampflow.modeling.user_model import parse_model_spec

    directory, _ = checkpoint
    spec = parse_model_spec(str(directory), ("bert_tiny",))
    assert spec.kind == "checkpoint"
    model = make_text_model(spec, SEQ, len(VOCABULARY), 3, policy="mixed_float16").model
    reference, _ = load_hf_bert(directory)
    encoder = model.get_layer("encoder")
    assert len(encoder.weights) == len(reference.weights)
    for mine, theirs in zip(encoder.weights, reference.weights, strict=True):
        assert mine.dtype == "float32"  # the checkpoint's variables stay float32 under AMP
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs), err_msg=mine.path)
    assert model.get_layer("logits").dtype_policy.compute_dtype == "float32"


def test_a_handle_is_one_line_with_its_download_command(tmp_path, capsys):
    code, _ = _cli("train", "--data-dir", str(tmp_path), "--output-dir", str(tmp_path / "m"),
                   "--model", "hf://google/bert_uncased_L-2_H-128_A-2")
    assert code == 2
    assert "huggingface-cli download google/bert_uncased_L-2_H-128_A-2" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(("break_it", "says"), [
    (lambda d: (d / "config.json").unlink(), "config.json"),
    (lambda d: None, "must be at most 128, the max_position_embeddings"),  # 200 > 128
])
def test_a_bad_checkpoint_is_one_line_naming_the_file_and_nothing_is_written(
        checkpoint, tmp_path_factory, tmp_path, capsys, break_it, says):
    import shutil

    directory = tmp_path / "copy"
    shutil.copytree(checkpoint[0], directory)
    break_it(directory)
    code, _ = _cli("train", "--data-dir", str(prepared_texts(tmp_path_factory)),
                   "--output-dir", str(tmp_path / "m"), "--model", str(directory),
                   "--max-sequence-length", "200")
    err = capsys.readouterr().err
    assert code == 2, err
    assert says in err and str(directory) in err and "Traceback" not in err
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_train_evaluate_export_from_a_checkpoint_serves_its_own_tokenizer(
        checkpoint, tmp_path_factory, tmp_path, monkeypatch):
    """The walk, and train reads the checkpoint once (issue 48: the checks, the tokenizer and
    the model took three reads; its own 1-step training run was merged into this one)."""
    import tensorflow as tf

    import ampflow.modeling.pretrained as pretrained
    from ampflow.artifacts.model_dir import load_trained
    from ampflow.data import load_dataset_info, load_texts
    from ampflow.modeling.twin import build_float32_twin

    reads = []
    real = pretrained.read_hf_bert

    def counting(directory):  # the real reader still runs
        reads.append(directory)
        return real(directory)

    monkeypatch.setattr(pretrained, "read_hf_bert", counting)
    directory, _ = checkpoint
    data_dir = prepared_texts(tmp_path_factory)
    model_dir = tmp_path / "model"
    code, out = _cli("train", "--data-dir", str(data_dir), "--output-dir", str(model_dir),
                     "--model", str(directory), "--precision", "mixed_float16", "--xla", "off",
                     "--max-sequence-length", str(SEQ), "--epochs", "6", "--seed", "1",
                     "--learning-rate", "3e-3")
    assert code == 0, out
    assert reads == [directory]
    settings = json.loads((model_dir / "tokenizer.json").read_text())
    assert (settings["kind"], settings["do_lower_case"]) == ("wordpiece", True)
    assert (model_dir / "vocab.txt").read_text().split("\n")[:-1] == VOCABULARY

    code, out = _cli("evaluate", "--model-dir", str(model_dir), "--data-dir", str(data_dir),
                     "--output-dir", str(tmp_path / "eval"))
    assert code == 0, out
    assert json.loads((tmp_path / "eval" / "verdict.json").read_text())["passed"], out

    code, out = _cli("export", "--model-dir", str(model_dir), "--data-dir", str(data_dir),
                     "--eval-dir", str(tmp_path / "eval"), "--export-base",
                     str(tmp_path / "serving"))
    assert code == 0, out
    version = tmp_path / "serving" / "ampflow" / "1"
    assert (version / "assets" / "vocab.txt").read_text().split("\n")[:-1] == VOCABULARY

    texts, _ = load_texts(data_dir, "test", limit=12)
    trained = load_trained(model_dir)
    twin = build_float32_twin(trained.model)  # what export serves: the float32 graph
    in_process = np.asarray(twin(trained.tokenizer.tokenize(tf.constant(texts)), training=False))
    served = tf.saved_model.load(str(version)).signatures["serving_default"](
        text=tf.constant(texts))
    np.testing.assert_array_equal(served["class_ids"].numpy(), in_process.argmax(-1))
    np.testing.assert_allclose(served["probabilities"].numpy(), in_process, atol=1e-5)

    # convert (float32, checked on token ids: the quantized variants of a model this barely
    # trained flip its near-even answers, and their gate says so; float16 differs from it in
    # the weights only, test_convert_tflite_text.py's), deploy, serve, predict --text
    code, out = _cli("convert", "--saved-model-dir", str(version), "--data-dir", str(data_dir),
                     "--output-dir", str(tmp_path / "tflite"), "--latency-runs", "2",
                     "--warmup-runs", "1", "--variants", "float32")
    assert code == 0, out
    report = json.loads((tmp_path / "tflite" / "report.json").read_text())
    assert report["variants"] and all(v["passed"] for v in report["variants"].values()), report
    code, out = _cli("deploy", "--target", "local", "--saved-model-dir", str(version),
                     "--model-store", str(tmp_path / "store"))
    assert code == 0, out
    from cli_walk import loopback_port, serve_and_predict

    port = loopback_port()
    serve, predict = serve_and_predict(
        ["serve", "--model-base-path", tmp_path / "store" / "ampflow", "--port", port],
        ["predict", "--port", port, "--wait-s", 60, "--text", texts[0]])
    assert (serve.code, predict.code) == (0, 0), serve.out
    expected = load_dataset_info(data_dir)["class_names"][int(in_process[0].argmax())]
    assert expected in predict.out, predict.out


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_check_model_passes_a_checkpoint_under_both_mixed_policies(checkpoint, tmp_path_factory,
                                                                    policy):
    """The AMP pre-flight on the fine-tuning step: no finding stops it, under either policy."""
    directory, _ = checkpoint
    code, out = _cli("check-model", "--data-dir", str(prepared_texts(tmp_path_factory)),
                     "--model", str(directory), "--precision", policy)
    assert code == 0, out


def test_check_model_takes_max_sequence_length_and_the_checkpoints_bound(
        checkpoint, tmp_path_factory, capsys):
    """check-model's flag has train's default (TokenizerConfig's) and its bound, one line."""
    from ampflow.cli import build_parser
    from ampflow.modeling.tokenizer import TokenizerConfig

    default = TokenizerConfig.__dataclass_fields__["max_sequence_length"].default
    parsed = build_parser().parse_args(["check-model", "--data-dir", "d", "--model", "m"])
    assert parsed.max_sequence_length == default
    directory, _ = checkpoint
    code, _ = _cli("check-model", "--data-dir", str(prepared_texts(tmp_path_factory)),
                   "--model", str(directory), "--max-sequence-length", "200")  # 200 > 128
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "must be at most 128, the max_position_embeddings" in err and str(directory) in err


def test_check_model_refuses_max_sequence_length_on_image_data(prepared_digits, capsys):
    code, _ = _cli("check-model", "--data-dir", str(prepared_digits), "--model", "small_cnn",
                   "--max-sequence-length", "64")
    err = capsys.readouterr().err
    assert code == 2 and "--max-sequence-length is for text data" in err, err
