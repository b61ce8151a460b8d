"""`ampflow pretrain`: a prepared text dataset's training texts → a checkpoint `train` takes.

The run is the CLI's, in process, at the smallest sizes (1 layer, 16 wide, 2 steps): what it
proves is the step's contract (the corpus is the training split, the checkpoint reads back
through the same reader `train --model DIR` uses, refusals are one line and write nothing),
not what pretraining buys (benchmarks/text_transfer.py measures that).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tiny_text_model import SEQ, TEST_ONLY_WORD, prepared_texts  # noqa: E402

from ampflow.cli import main  # noqa: E402

TINY = ["--num-hidden-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
        "--max-sequence-length", str(SEQ), "--vocabulary-size", "120", "--epochs", "2",
        "--batch-size", "8", "--steps-per-epoch", "2"]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.slow
def test_pretrain_writes_a_checkpoint_of_the_training_texts_that_train_reads(
        tmp_path_factory, tmp_path, capsys):
    from ampflow.modeling.hf_bert import read_hf_bert

    data_dir, out = prepared_texts(tmp_path_factory), tmp_path / "encoder"
    assert main(["pretrain", "--data-dir", str(data_dir), "--output-dir", str(out),
                 *TINY]) == 0
    stdout = capsys.readouterr().out
    assert "ampflow pretrain: done" in stdout and f"ampflow train --model {out}" in stdout
    checkpoint = read_hf_bert(out)  # the reader of `train --model DIR`, every tensor checked
    assert checkpoint.config.num_hidden_layers == 1 and checkpoint.config.hidden_size == 16
    assert checkpoint.config.max_position_embeddings == SEQ
    assert TEST_ONLY_WORD not in checkpoint.vocabulary  # built from the training split only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["encoder"]  # no staging left


def test_an_image_dataset_is_one_line_and_nothing_is_written(prepared_digits, tmp_path,
                                                              capsys):
    out = tmp_path / "encoder"
    assert main(["pretrain", "--data-dir", str(prepared_digits), "--output-dir", str(out),
                 *TINY]) == 2
    assert "not texts: masked-LM pretraining needs a text dataset" in _one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_output_dir_is_refused_and_left_as_it_was(tmp_path_factory, tmp_path,
                                                               capsys):
    out = tmp_path / "encoder"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["pretrain", "--data-dir", str(prepared_texts(tmp_path_factory)),
                 "--output-dir", str(out), *TINY]) == 2
    assert "exists: a checkpoint is written to a new folder only" in _one_error_line(capsys)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(("flags", "message"), [
    (["--hidden-size", "15"], "--hidden-size must be a multiple of --num-attention-heads"),
    (["--mask-rate", "1.5"], "--mask-rate must be in (0, 1)"),
    (["--vocabulary-size", "4"], "--vocabulary-size must be an integer >= 16"),
])
def test_a_bad_size_is_one_line_naming_the_flag(flags, message, tmp_path, capsys):
    assert main(["pretrain", "--data-dir", str(tmp_path), "--output-dir",
                 str(tmp_path / "encoder"), *flags]) == 2
    assert message in _one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_is_not_a_prepared_dataset_is_one_line(tmp_path, capsys):
    assert main(["pretrain", "--data-dir", str(tmp_path), "--output-dir",
                 str(tmp_path / "encoder")]) == 2
    assert "is not a prepared dataset" in _one_error_line(capsys)


@pytest.mark.slow
def test_a_vocabulary_too_small_for_the_corpus_names_the_flag(tmp_path_factory, tmp_path,
                                                              capsys):
    out = tmp_path / "encoder"
    assert main(["pretrain", "--data-dir", str(prepared_texts(tmp_path_factory)),
                 "--output-dir", str(out), *TINY, "--vocabulary-size", "16"]) == 2
    assert "--vocabulary-size must hold the special tokens" in _one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []
