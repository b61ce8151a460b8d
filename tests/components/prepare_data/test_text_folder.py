"""--text-folder: .txt files in keras text_dataset_from_directory's layout, made here."""

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data
from ampflow.data.text_input import load_texts
from ampflow.errors import ConfigError, DatasetConfigError

CLASSES = ("neg", "neutral", "pos")
PER_CLASS = 10
MAX_BYTES = 300  # small, so that an oversized file is cheap to make


def make_text_folder(root: Path, classes=CLASSES, per_class: int = PER_CLASS,
                     seed: int = 0) -> Path:
    """`per_class` short UTF-8 reviews per class folder (some in a nested sub-folder)."""
    rng = np.random.default_rng(seed)
    for name in classes:
        for i in range(per_class):
            folder = root / name / ("more" if i % 4 == 3 else "")
            folder.mkdir(parents=True, exist_ok=True)
            words = " ".join(rng.choice(["film", "plot", "café", "naïve", "acting"], 5))
            (folder / f"{i:02d}.txt").write_text(f"{name} review {i}: {words}\n",
                                                 encoding="utf-8")
    return root


def add_bad_files(root: Path) -> None:
    """One of each thing that must be left out, counted and listed; and a BOM file, kept."""
    (root / "neg" / "latin1.txt").write_bytes("un film très raté".encode("latin-1"))
    (root / "pos" / "blank.txt").write_text("  \n\t\n")
    (root / "pos" / "huge.txt").write_text("word " * MAX_BYTES)
    (root / "neutral" / "notes.md").write_text("not a .txt file")
    (root / "README").write_text("about this folder")
    (root / "pos" / "bom.txt").write_bytes(b"\xef\xbb\xbfwith a byte order mark")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = make_text_folder(tmp_path_factory.mktemp("reviews") / "reviews")
    add_bad_files(root)
    return root


@pytest.fixture(scope="module")
def prepared_folder(folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared-text")
    run_prepare_data(PrepareDataConfig(output_dir=out, text_folder=folder,
                                       max_text_bytes=MAX_BYTES))
    return out


def _info(prepared: Path) -> dict:
    return json.loads((prepared / "dataset_info.json").read_text())


def test_text_folder_prepares_every_readable_text_with_its_class(prepared_folder, folder):
    info = _info(prepared_folder)
    assert info["name"] == "ampflow_text_folder" and info["modality"] == "text"
    assert info["text_key"] == "text" and info["label_key"] == "label"
    assert info["class_names"] == list(CLASSES) and info["text_source"] == str(folder)
    assert info["text_source_kind"] == "folder" and info["max_text_bytes"] == MAX_BYTES
    assert info["splits"] == {"train": 28, "test": 3}  # 30 + the BOM file, 1 per class held out
    texts = []
    for split in ("train", "test"):
        split_texts, labels = load_texts(prepared_folder, split)
        texts += split_texts
        for text, label in zip(split_texts, labels, strict=True):
            assert text.startswith(CLASSES[label]) or text == "with a byte order mark"
    assert "with a byte order mark" in texts  # the BOM dropped, the file kept
    assert any("café" in t and "naïve" in t for t in texts)  # UTF-8 read as UTF-8


def test_text_folder_counts_and_lists_every_left_out_file(prepared_folder):
    skipped = _info(prepared_folder)["skipped_files"]
    assert skipped["count"] == 5 and skipped["listed"] == 5
    assert skipped["by_reason"] == {"not UTF-8": 1, "empty": 1,
                                    "larger than max_text_bytes": 1, "not a .txt file": 1,
                                    "not inside a class folder": 1}
    reasons = {f["path"]: f["reason"] for f in skipped["files"]}
    assert reasons == {"neg/latin1.txt": "not UTF-8", "pos/blank.txt": "empty",
                       "pos/huge.txt": "larger than max_text_bytes",
                       "neutral/notes.md": "not a .txt file",
                       "README": "not inside a class folder"}
    details = {f["path"]: f.get("detail") for f in skipped["files"]}
    assert details["neg/latin1.txt"] == "byte 0xe8 at offset 10"  # the 'è' of 'très'
    assert details["pos/huge.txt"] == f"{5 * MAX_BYTES} bytes > {MAX_BYTES}"


def test_text_folder_train_and_test_levels_are_the_splits(tmp_path):
    make_text_folder(tmp_path / "aclImdb" / "train", classes=("neg", "pos"), per_class=6)
    make_text_folder(tmp_path / "aclImdb" / "test", classes=("neg", "pos"), per_class=2, seed=1)
    (tmp_path / "aclImdb" / "imdb.vocab").write_text("film\n")
    info = run_prepare_data(PrepareDataConfig(output_dir=tmp_path / "out",
                                              text_folder=tmp_path / "aclImdb")).info
    assert info["splits"] == {"train": 12, "test": 4} and info["holdout"] is None
    assert info["text_source_details"] == {"layout": "splits"}
    assert {f["path"] for f in info["skipped_files"]["files"]} == {"imdb.vocab"}


def test_text_folder_rerun_reuses_unchanged_and_rebuilds_changed(tmp_path, caplog):
    root = make_text_folder(tmp_path / "f", classes=("a", "b"), per_class=3)
    (root / "b" / "blank.txt").write_text(" ")
    config = PrepareDataConfig(output_dir=tmp_path / "out", text_folder=root)
    first = run_prepare_data(config).info
    with caplog.at_level(logging.INFO):
        again = run_prepare_data(config).info
    assert again["full_name"] == first["full_name"]
    assert again["skipped_files"] == first["skipped_files"]  # the count survives the reuse
    assert again["skipped_files"]["by_reason"] == {"empty": 1}
    assert any("unchanged since it was prepared" in r.getMessage() for r in caplog.records)
    (root / "a" / "new.txt").write_text("one more")
    second = run_prepare_data(config).info
    assert second["full_name"] != first["full_name"]  # not silently stale
    assert sum(second["splits"].values()) == sum(first["splits"].values()) + 1


def test_text_folder_non_utf8_file_is_counted_not_fatal_in_the_cli(folder, tmp_path, capsys,
                                                                  caplog):
    from ampflow.cli import main

    with caplog.at_level(logging.WARNING):
        code = main(["prepare-data", "--text-folder", str(folder), "--max-text-bytes",
                     str(MAX_BYTES), "--output-dir", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err
    assert "skipped_files  5" in capsys.readouterr().out
    warning = [r.getMessage() for r in caplog.records if "left out 5 texts" in r.getMessage()]
    assert len(warning) == 1 and "1 not UTF-8" in warning[0] and "neg/latin1.txt" in warning[0]


def _assert_nothing_left(out: Path) -> None:
    assert not out.exists()


@pytest.mark.parametrize(("setup", "error", "message"), [
    (lambda root: None, ConfigError, r"text_folder must be an existing directory.*missing"),
    (lambda root: root.mkdir(), DatasetConfigError,
     r"text_folder must hold one sub-folder per class.*no class sub-folders"),
    (lambda root: make_text_folder(root, classes=("solo",), per_class=2), DatasetConfigError,
     r"at least 2 class sub-folders.*Received: \['solo'\]"),
    (lambda root: [(root / c).mkdir(parents=True) or (root / c / "a.txt").write_bytes(b"\xff")
                   for c in CLASSES], DatasetConfigError,
     r"at least one readable UTF-8 text.*3 left out \(3 not UTF-8\)"),
    (lambda root: make_text_folder(root / "train", classes=("a", "b")) and
     make_text_folder(root / "val", classes=("a", "b")), ConfigError,
     r"train/ and val/: rename the validation folder"),
], ids=["missing", "empty", "one-class", "no-readable-text", "train-and-val"])
def test_text_folder_bad_folder_is_a_clear_error_and_leaves_nothing(tmp_path, setup, error,
                                                                    message):
    root = tmp_path / "texts"
    setup(root)
    out = tmp_path / "out"
    with pytest.raises(error, match=message):
        run_prepare_data(PrepareDataConfig(output_dir=out, text_folder=root))
    _assert_nothing_left(out)


def test_text_folder_empty_folder_is_one_line_in_the_cli(tmp_path, capsys):
    from ampflow.cli import main

    (tmp_path / "texts").mkdir()
    code = main(["prepare-data", "--text-folder", str(tmp_path / "texts"), "--output-dir",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1  # a flag that names no usable input: configuration
    assert err[0].startswith("ampflow prepare-data: error: --text-folder must hold one "
                             "sub-folder per class")
    _assert_nothing_left(tmp_path / "out")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"text_folder": "x", "dataset": "mnist"}, "text_folder and dataset are alternatives"),
    ({"text_folder": "x", "text_file": "y.csv"}, "text_folder and text_file are alternatives"),
    ({"text_folder": "x", "image_folder": "y"}, "image_folder and text_folder are alternatives"),
    ({"text_folder": "x", "text_feature": "title"}, "text_feature names a feature of a TFDS"),
    ({"text_folder": "x", "image_size": 8}, "image_size applies to images"),
    ({"text_file": "x.csv", "text_column": "t", "label_column": "t"},
     "text_column and label_column must be two columns"),
    ({"max_text_bytes": 0}, r"max_text_bytes must be a positive integer. Received: "
                            r"max_text_bytes=0"),
])
def test_text_options_that_contradict_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        PrepareDataConfig(output_dir="out", **kwargs)


def test_prepare_data_component_takes_a_text_folder(folder, tmp_path):
    from kfp import dsl

    from ampflow.components.prepare_data.component import prepare_data

    data = dsl.Dataset(uri=str(tmp_path / "data"))
    prepare_data(dataset="ampflow_digits", data=data, text_folder=str(folder),
                 max_text_bytes=MAX_BYTES)
    assert data.metadata["modality"] == "text" and data.metadata["text_key"] == "text"
    assert data.metadata["num_classes"] == 3 and data.metadata["skipped_files"] == 5
    assert "image_shape" not in data.metadata


def test_prepare_data_component_defaults_are_the_configs():
    import inspect

    from ampflow.components.prepare_data.component import prepare_data

    defaults = {k: p.default for k, p in inspect.signature(prepare_data).parameters.items()}
    fields = PrepareDataConfig.__dataclass_fields__
    for name in ("text_column", "label_column", "max_text_bytes", "test_fraction"):
        assert defaults[name] == fields[name].default, name
    for name in ("text_folder", "text_file", "text_feature", "image_folder"):
        assert defaults[name] == "" and fields[name].default is None, name
