"""--text-file: CSV, TSV and JSONL tables of texts and labels, made here, with bad rows in them."""

import json
from pathlib import Path

import numpy as np
import pytest

from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data
from ampflow.data.text_input import load_texts
from ampflow.errors import ConfigError, DatasetConfigError

MAX_BYTES = 200


def _csv_bytes() -> bytes:
    """A header, 12 good rows (quoted commas and a newline inside one), then bad rows."""
    lines = ["id,review,sentiment"]
    for i in range(12):
        label = ("negative", "positive")[i % 2]
        lines.append(f'{i},"review {i}, with a comma",{label}')
    lines.append('12,"two\nlines",positive')  # rows 2..14 good; this one spans lines 14-15
    text = "\n".join(lines) + "\n"
    bad = ("13,   ,negative\n"                  # line 16: empty text
           "14,no label here,\n"                # line 17: no label
           f'15,"{"x" * (MAX_BYTES + 1)}",positive\n'  # line 18: too large
           "16,trailing,positive,extra\n")      # line 19: a field too many
    latin1 = "17,très mauvais,negative\n".encode("latin-1")  # line 20: not UTF-8
    return text.encode("utf-8") + bad.encode("utf-8") + latin1 + b"18,last one,negative\n"


@pytest.fixture(scope="module")
def csv_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("table") / "reviews.csv"
    path.write_bytes(_csv_bytes())
    return path


@pytest.fixture(scope="module")
def prepared_csv(csv_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared-csv")
    run_prepare_data(PrepareDataConfig(output_dir=out, text_file=csv_file, text_column="review",
                                       label_column="sentiment", max_text_bytes=MAX_BYTES))
    return out


def _info(prepared: Path) -> dict:
    return json.loads((prepared / "dataset_info.json").read_text())


def test_csv_table_keeps_good_rows_with_their_class(prepared_csv, csv_file):
    info = _info(prepared_csv)
    assert info["name"] == "ampflow_text_file" and info["text_source"] == str(csv_file)
    assert info["class_names"] == ["negative", "positive"]
    assert info["text_source_details"] == {"format": "csv", "text_column": "review",
                                           "label_column": "sentiment"}
    assert sum(info["splits"].values()) == 14  # 12 + the two-line row + the last row
    texts = load_texts(prepared_csv, "train")[0] + load_texts(prepared_csv, "test")[0]
    assert "two\nlines" in texts and "review 3, with a comma" in texts and "last one" in texts


def test_csv_table_counts_each_bad_row_with_its_line(prepared_csv):
    skipped = _info(prepared_csv)["skipped_files"]
    assert skipped["count"] == 5
    lines = {f["line"]: f["reason"] for f in skipped["files"]}
    assert lines == {16: "empty", 17: "no label", 18: "larger than max_text_bytes",
                     19: "malformed row", 20: "not UTF-8"}
    assert all(f["path"] == "reviews.csv" for f in skipped["files"])


def test_tsv_table_takes_quotes_as_ordinary_characters(tmp_path):
    path = tmp_path / "dev.tsv"
    rows = [f'a "quoted" word {i}\t{i % 2}' for i in range(8)]
    path.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    info = run_prepare_data(PrepareDataConfig(output_dir=out, text_file=path,
                                              text_column="sentence")).info
    assert info["class_names"] == ["0", "1"] and info["skipped_files"]["count"] == 0
    texts, labels = load_texts(out, "train")
    assert all(t.startswith('a "quoted" word ') for t in texts)
    assert all(int(t.rsplit(" ", 1)[1]) % 2 == y for t, y in zip(texts, labels, strict=True))


def test_jsonl_table_sorts_integer_labels_numerically_and_counts_bad_lines(tmp_path):
    path = tmp_path / "news.jsonl"
    good = [json.dumps({"text": f"story {i}", "label": i % 11}) for i in range(33)]
    bad = [b"{not json", b"[1, 2]", json.dumps({"text": 5, "label": 1}).encode(),
           '{"text": "caf\xe9", "label": 1}'.encode("latin-1"),
           json.dumps({"label": 2}).encode(), json.dumps({"text": "x", "label": None}).encode()]
    path.write_bytes(b"\n".join([g.encode() for g in good] + [b""] + bad) + b"\n")
    out = tmp_path / "out"
    info = run_prepare_data(PrepareDataConfig(output_dir=out, text_file=path)).info
    assert info["class_names"] == [str(i) for i in range(11)]  # 10 after 9, not after 1
    texts, labels = load_texts(out, "train")
    assert all(int(t.split()[1]) % 11 == y for t, y in zip(texts, labels, strict=True))
    skipped = info["skipped_files"]
    assert skipped["by_reason"] == {"malformed row": 4, "not UTF-8": 1, "no label": 1}
    assert [f["line"] for f in skipped["files"]] == [35, 36, 37, 38, 39, 40]  # 34 is blank


def test_text_file_unknown_column_is_one_line_and_writes_nothing(csv_file, tmp_path, capsys):
    from ampflow.cli import main

    out = tmp_path / "out"
    code = main(["prepare-data", "--text-file", str(csv_file), "--text-column", "body",
                 "--label-column", "sentiment", "--output-dir", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert ("--text-column must name a column of reviews.csv. Received: --text-column='body'; "
            "the columns are id, review, sentiment") in err[0]
    assert not out.exists()


def test_text_file_label_column_with_one_class_is_one_line(tmp_path, capsys):
    from ampflow.cli import main

    path = tmp_path / "one.csv"
    path.write_text("text,label\n" + "".join(f"text {i},spam\n" for i in range(5)))
    out = tmp_path / "out"
    code = main(["prepare-data", "--text-file", str(path), "--output-dir", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "--label-column must hold at least 2 classes" in err[0]
    assert "only the class 'spam' in 5 kept rows" in err[0]
    assert not out.exists()


@pytest.mark.parametrize(("name", "content", "error", "message"), [
    ("t.txt", "text,label\n", ConfigError, r"text_file must end in \.csv, \.tsv, \.jsonl"),
    ("missing.csv", None, ConfigError, r"text_file must be an existing .*missing"),
    ("empty.csv", "", DatasetConfigError, r"first row must name the columns.*is empty"),
    ("headers.csv", "text,label\n", DatasetConfigError, r"at least 2 classes.*no labelled row"),
], ids=["extension", "missing", "empty", "header-only"])
def test_text_file_bad_file_is_a_clear_error_and_leaves_nothing(tmp_path, name, content, error,
                                                                message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    out = tmp_path / "out"
    with pytest.raises(error, match=message):
        run_prepare_data(PrepareDataConfig(output_dir=out, text_file=path))
    assert not out.exists()


def test_csv_field_limit_is_restored_after_reading(tmp_path):
    import csv

    before = csv.field_size_limit()
    path = tmp_path / "t.csv"
    path.write_text("text,label\n" + "".join(f"t{i},{i % 2}\n" for i in range(6)))
    run_prepare_data(PrepareDataConfig(output_dir=tmp_path / "out", text_file=path,
                                       max_text_bytes=10 * before))
    assert csv.field_size_limit() == before
    assert np.array_equal(sorted(load_texts(tmp_path / "out", "train")[1].tolist() +
                                 load_texts(tmp_path / "out", "test")[1].tolist()),
                          [0, 0, 0, 1, 1, 1])
