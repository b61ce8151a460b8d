"""benchmarks/image_transfer.py's parts that decide what it measures, cheaply (no training).

The source and target folders: disjoint classes, the small folder's size, the dataset's own
test split held out of both, a folder `prepare-data --image-folder` takes as five classes; and
the report's table, read back cell by cell. The whole script (three mobilenet_v2 trainings in
processes of their own, ~2.5 CPU-minutes at its smallest sizes) is run by hand, not here.
"""

from __future__ import annotations

import json

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("image_transfer")


@pytest.fixture(scope="module")
def digits():
    """ampflow_mnist's 5,000 images and labels, read once (a few CPU-s)."""
    from ampflow.data.offline_mnist import load_mnist_5k

    return load_mnist_5k()


@pytest.fixture(scope="module")
def folders(bench, digits, tmp_path_factory):
    return bench.write_folders(tmp_path_factory.mktemp("folders"), per_class=3,
                               source_per_class=2, digits=digits)


def _files(folder, split: str) -> dict[str, set[str]]:
    return {d.name: {f.name for f in d.iterdir()} for d in sorted((folder / split).iterdir())}


def test_the_tasks_share_no_class_and_the_target_is_a_small_folder(folders):
    source, target = (_files(folders[name], "train") for name in ("source", "target"))
    assert list(source) == ["0", "1", "2", "3", "4"] and list(target) == ["5", "6", "7", "8", "9"]
    assert [len(f) for f in source.values()] == [2] * 5
    assert [len(f) for f in target.values()] == [3] * 5
    assert folders["counts"] == {"source": {"train": 10, "test": 500},
                                 "target": {"train": 15, "test": 500}}


def test_the_test_images_are_the_datasets_test_split_and_never_trained_on(folders, digits):
    """File names are the dataset's row numbers: offline_mnist's own 80/20 split decides."""
    from ampflow.data.offline_digits import stratified_split
    from ampflow.data.offline_mnist import SPLIT_SEED, TEST_FRACTION

    _, labels = digits
    train, test = stratified_split(labels, TEST_FRACTION, SPLIT_SEED)
    for name in ("source", "target"):
        rows = {split: {int(f.split(".")[0]) for files in _files(folders[name], split).values()
                        for f in files} for split in ("train", "test")}
        assert rows["train"] <= set(train.tolist())
        classes = {int(d) for d in _files(folders[name], "test")}
        assert rows["test"] == {int(i) for i in test if labels[i] in classes}
        for digit, files in _files(folders[name], "train").items():
            assert {int(labels[int(f.split(".")[0])]) for f in files} == {int(digit)}


def test_prepare_data_reads_the_target_folder_as_five_grayscale_classes(folders, tmp_path):
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    run_prepare_data(PrepareDataConfig(output_dir=tmp_path, image_folder=folders["target"]))
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    text = json.dumps(info)
    assert info["num_classes"] == 5, text
    assert info["class_names"] == ["5", "6", "7", "8", "9"], text
    assert list(info["image_shape"]) == [28, 28, 1], text
    assert info["splits"] == {"train": 15, "test": 500}, text


def test_the_report_table_gives_each_arm_its_interval_and_the_paired_difference(bench):
    from text_transfer import summary

    runs = [{"arm": arm, "seed": seed, "test_accuracy": acc}
            for arm, accs in (("pretrained", (0.9, 0.8, 0.85)), ("scratch", (0.7, 0.7, 0.6)))
            for seed, acc in zip((1, 2, 3), accs, strict=True)]
    report = {"model": bench.MODEL, "dataset": "ampflow_mnist", "load_before": [1, 1, 1],
              "host": {"capabilities": {}, "cpu_count": 2, "cpu_flags": ["avx2"],
                       "tensorflow": "2"},
              "settings": {"per_class": 50, "epochs": 10, "batch_size": 16, "pretrain_epochs": 8,
                           "head_epochs": 5, "head_learning_rate": 1e-3,
                           "pretrained_lr": 1e-5, "scratch_lr": 3e-3},
              "folders": {"source": {"train": 2000, "test": 500},
                          "target": {"train": 250, "test": 500}},
              "pretraining": None, "runs": runs, "summary": summary(runs)}
    lines = bench.markdown(report)
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines
            if line.startswith("| pretrained") or line.startswith("| scratch")]
    # pretrained: mean 0.85, sd 0.05, half-width 4.303 * 0.05 / sqrt(3) = 0.1242
    assert rows == [["pretrained", "85.0 % ± 12.4 (n=3)", "90.0, 80.0, 85.0"],
                    ["scratch", "66.7 % ± 14.3 (n=3)", "70.0, 70.0, 60.0"]]
    # differences 0.2, 0.1, 0.25: mean 0.1833, sd 0.0764, half-width 0.1897
    assert lines[-1] == ("Paired difference (pretrained − scratch, same seed): "
                         "18.3 points ± 19.0 (n=3).")


def test_batch_statistics_add_a_column_of_their_own(bench):
    """`--batch-statistics` (a diagnosis) is a column beside the measured accuracy, not in it."""
    from text_transfer import summary

    runs = [{"arm": arm, "seed": 1, "test_accuracy": acc, "test_accuracy_batch_statistics": bs}
            for arm, acc, bs in (("pretrained", 0.5, 0.25), ("scratch", 0.2, 0.75))]
    report = {"model": bench.MODEL, "dataset": "ampflow_mnist", "load_before": [1, 1, 1],
              "host": {"capabilities": {}, "cpu_count": 2, "cpu_flags": [], "tensorflow": "2"},
              "settings": {"per_class": 50, "epochs": 10, "batch_size": 16, "pretrain_epochs": 8,
                           "head_epochs": 5, "head_learning_rate": 1e-3,
                           "pretrained_lr": 1e-5, "scratch_lr": 3e-3},
              "folders": {"source": {"train": 2000, "test": 500},
                          "target": {"train": 250, "test": 500}},
              "pretraining": None, "runs": runs, "summary": summary(runs)}
    lines = bench.markdown(report)
    table = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines
             if line.startswith("|")]
    assert table[0] == ["arm", "test accuracy", "per seed", "with batch statistics, per seed"]
    assert table[2:] == [["pretrained", "50.0 % (n=1)", "50.0", "25.0"],
                         ["scratch", "20.0 % (n=1)", "20.0", "75.0"]]
