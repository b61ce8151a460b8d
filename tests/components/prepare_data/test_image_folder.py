"""--image-folder: a folder of real PNG/JPEG/BMP/GIF files made here, through TFDS."""

import io
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data
from ampflow.data import load_arrays, load_split, make_input_pipeline
from ampflow.errors import ConfigError, DatasetError

CLASSES = ("cat", "dog", "owl")
FORMATS = ("PNG", "JPEG", "BMP", "GIF")
MODES = ("RGB", "L", "RGBA", "RGB", "P", "RGB", "L", "RGB", "RGB", "RGB")
PER_CLASS = len(MODES)


def _image(rng, size: tuple[int, int], mode: str) -> Image.Image:
    height, width = size
    rgba = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
    image = Image.fromarray(rgba, "RGBA")
    if mode == "P":
        return image.convert("RGB").convert("P")
    return image.convert(mode)


def _save(image: Image.Image, path: Path, fmt: str) -> None:
    if fmt == "JPEG" and image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    if fmt == "BMP" and image.mode == "P":
        image = image.convert("RGB")
    image.save(path, format=fmt)


def make_folder(root: Path, seed: int = 0, classes=CLASSES, per_class: int = PER_CLASS,
                same_size: tuple[int, int] | None = None) -> Path:
    """Classes of images of different sizes, formats and modes, + 1 corrupt + 1 non-image."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            size = same_size or (int(rng.integers(6, 20)), int(rng.integers(6, 20)))
            fmt = FORMATS[(i + c) % len(FORMATS)]
            _save(_image(rng, size, MODES[i]), root / name / f"{i:02d}.{fmt.lower()}", fmt)
    return root


def add_bad_files(root: Path) -> None:
    good = io.BytesIO()
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(good, format="JPEG")
    (root / CLASSES[1] / "broken.jpg").write_bytes(good.getvalue()[:120])  # truncated
    (root / CLASSES[2] / "notes.txt").write_text("not an image")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = make_folder(tmp_path_factory.mktemp("pets") / "pets")
    add_bad_files(root)
    return root


@pytest.fixture(scope="module")
def prepared_folder(folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared")
    run_prepare_data(PrepareDataConfig(output_dir=out, image_folder=folder, image_size=(16, 12)))
    return out


def _info(prepared: Path) -> dict:
    return json.loads((prepared / "dataset_info.json").read_text())


def test_image_folder_prepares_every_readable_image_at_image_size(prepared_folder, folder):
    info = _info(prepared_folder)
    assert info["name"] == "ampflow_image_folder" and info["image_folder"] == str(folder)
    assert info["class_names"] == list(CLASSES) and info["num_classes"] == 3
    assert info["image_shape"] == [16, 12, 3]  # RGB and gray mixed: the dataset is RGB
    assert info["source_image_shape"] == [None, None, 3]
    assert info["resize"] == {"method": "bilinear", "antialias": True,
                              "keeps_aspect_ratio": False}
    assert sum(info["splits"].values()) == 3 * PER_CLASS
    for split in ("train", "test"):
        images, labels = load_arrays(prepared_folder, split)
        assert images.shape == (info["splits"][split], 16, 12, 3)
        assert images.dtype == np.float32 and labels.dtype == np.int64
        assert 0.0 <= images.min() and images.max() <= 255.0


def test_image_folder_lists_corrupt_and_non_image_files(prepared_folder, folder, caplog):
    skipped = _info(prepared_folder)["skipped_files"]
    assert skipped["count"] == 2
    reasons = {f["path"]: f["reason"] for f in skipped["files"]}
    assert reasons["owl/notes.txt"] == "not an image"
    assert reasons["dog/broken.jpg"].startswith("corrupt: ")
    with caplog.at_level(logging.WARNING):  # the log line, also when the data is reused
        run_prepare_data(PrepareDataConfig(output_dir=prepared_folder, image_folder=folder,
                                           image_size=(16, 12)))
    lines = [r.getMessage() for r in caplog.records if "skipped 2 files" in r.getMessage()]
    assert len(lines) == 1 and "dog/broken.jpg" in lines[0] and "owl/notes.txt" in lines[0]


def test_image_folder_without_test_folder_holds_out_each_class(prepared_folder):
    info = _info(prepared_folder)
    holdout = info["holdout"]
    assert holdout["fraction"] == 0.1 and info["split_specs"] == {"train": "train",
                                                                  "test": "train"}
    _, test_labels = load_arrays(prepared_folder, "test")
    _, train_labels = load_arrays(prepared_folder, "train")
    assert np.bincount(test_labels, minlength=3).tolist() == [1, 1, 1]  # round(10 * 0.1)
    assert np.bincount(train_labels, minlength=3).tolist() == [9, 9, 9]


def test_image_folder_test_level_is_used_as_the_test_split(tmp_path):
    make_folder(tmp_path / "data" / "train", per_class=4)
    make_folder(tmp_path / "data" / "test", per_class=2, seed=1)
    info = run_prepare_data(PrepareDataConfig(output_dir=tmp_path / "out",
                                              image_folder=tmp_path / "data",
                                              image_size=8)).info
    assert info["splits"] == {"train": 12, "test": 6} and info["holdout"] is None
    assert info["class_names"] == list(CLASSES) and info["image_shape"] == [8, 8, 3]


def test_image_folder_with_train_and_val_is_refused_not_read_as_classes(tmp_path):
    make_folder(tmp_path / "data" / "train", per_class=2)
    make_folder(tmp_path / "data" / "val", per_class=2, seed=1)
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"train/ and val/: rename the validation folder"):
        run_prepare_data(PrepareDataConfig(output_dir=out, image_folder=tmp_path / "data",
                                           image_size=8))
    _assert_nothing_left(out)


def test_image_folder_same_size_images_need_no_image_size_and_keep_pixels(tmp_path):
    rgba = np.random.default_rng(2).integers(0, 256, (5, 7, 4), dtype=np.uint8)
    gray = np.arange(35, dtype=np.uint8).reshape(5, 7)
    for name in ("a", "b"):
        (tmp_path / "d" / name).mkdir(parents=True)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "d" / "a" / "x.png")
    Image.fromarray(gray, "L").save(tmp_path / "d" / "b" / "y.bmp")
    Image.fromarray(gray, "L").save(tmp_path / "d" / "b" / "z.png")
    out = tmp_path / "out"
    info = run_prepare_data(PrepareDataConfig(output_dir=out, image_folder=tmp_path / "d")).info
    assert info["image_shape"] == [5, 7, 3] == info["source_image_shape"]
    assert info["splits"] == {"train": 2, "test": 1}  # a class of one image stays in train
    for split in ("train", "test"):
        images, labels = load_arrays(out, split)
        assert images.dtype == np.uint8  # nothing resized: the exact pixels
        for image, label in zip(images, labels, strict=True):
            expected = rgba[..., :3] if label == 0 else np.repeat(gray[..., None], 3, -1)
            np.testing.assert_array_equal(image, expected)  # alpha dropped, gray repeated


def test_image_folder_of_grayscale_images_has_one_channel(tmp_path):
    rng = np.random.default_rng(3)
    for name in ("x", "y"):
        (tmp_path / "g" / name).mkdir(parents=True)
        for i, fmt in enumerate(("PNG", "JPEG", "BMP")):
            Image.fromarray(rng.integers(0, 256, (6 + i, 9), dtype=np.uint8), "L").save(
                tmp_path / "g" / name / f"{i}.{fmt.lower()}", format=fmt)
    info = run_prepare_data(PrepareDataConfig(output_dir=tmp_path / "out",
                                              image_folder=tmp_path / "g", image_size=4)).info
    assert info["image_shape"] == [4, 4, 1]
    images, _ = load_arrays(tmp_path / "out", "test")
    assert images.shape[1:] == (4, 4, 1)


def test_image_folder_rerun_reuses_unchanged_and_rebuilds_changed_folder(tmp_path):
    root = make_folder(tmp_path / "f", per_class=3)
    config = PrepareDataConfig(output_dir=tmp_path / "out", image_folder=root, image_size=8)
    first = run_prepare_data(config).info
    assert run_prepare_data(config).info["full_name"] == first["full_name"]
    Image.fromarray(np.zeros((9, 9, 3), np.uint8)).save(root / "cat" / "new.png")
    second = run_prepare_data(config).info
    assert second["full_name"] != first["full_name"]  # not silently stale
    assert sum(second["splits"].values()) == sum(first["splits"].values()) + 1


def test_image_folder_prepare_is_deterministic(folder, prepared_folder, tmp_path):
    run_prepare_data(PrepareDataConfig(output_dir=tmp_path, image_folder=folder,
                                       image_size=(16, 12), tfds_data_dir=tmp_path / "other"))
    assert _info(tmp_path)["holdout"] == _info(prepared_folder)["holdout"]
    for split in ("train", "test"):
        a, b = load_arrays(tmp_path, split), load_arrays(prepared_folder, split)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_image_folder_trains_through_the_input_pipeline_with_augment(prepared_folder):
    ds = make_input_pipeline(load_split(prepared_folder, "train"), batch_size=4,
                             training=True, augment=True)
    images, labels = next(iter(ds))
    assert images.shape == (4, 16, 12, 3) and labels.shape == (4,)


def test_image_folder_varying_sizes_without_image_size_names_the_flag(folder, tmp_path):
    with pytest.raises(DatasetError, match=r"varying size.*--image-size"):
        run_prepare_data(PrepareDataConfig(output_dir=tmp_path / "out", image_folder=folder))
    assert not (tmp_path / "out").exists()  # nothing half-written, no empty dirs


def _assert_nothing_left(out: Path) -> None:
    assert not out.exists()


@pytest.mark.parametrize(("setup", "error", "message"), [
    (lambda root: None, ConfigError, r"image_folder must be an existing directory.*missing"),
    (lambda root: root.mkdir(), DatasetError, r"one sub-folder per class.*no class sub-folders"),
    (lambda root: make_folder(root, classes=("solo",), per_class=2), DatasetError,
     r"at least 2 class sub-folders.*Received: \['solo'\]"),
    (lambda root: [(root / c).mkdir(parents=True) or (root / c / "a.txt").write_text("x")
                   for c in CLASSES], DatasetError,
     r"at least one readable JPEG/PNG/BMP/GIF image.*3 unreadable files"),
], ids=["missing", "empty", "one-class", "no-readable-image"])
def test_image_folder_bad_folder_is_a_clear_error_and_leaves_nothing(tmp_path, setup, error,
                                                                     message):
    root = tmp_path / "images"
    setup(root)
    out = tmp_path / "out"
    with pytest.raises(error, match=message):
        run_prepare_data(PrepareDataConfig(output_dir=out, image_folder=root, image_size=8))
    _assert_nothing_left(out)


def test_image_folder_with_a_dataset_name_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="image_folder and dataset are alternatives"):
        PrepareDataConfig(output_dir=tmp_path, image_folder=tmp_path, dataset="mnist")


def test_image_folder_file_outside_class_folders_is_listed(tmp_path):
    root = make_folder(tmp_path / "f", per_class=2)
    (root / "README.md").write_text("about")
    os.makedirs(root / ".cache")
    (root / ".cache" / "x.png").write_bytes(b"")
    info = run_prepare_data(PrepareDataConfig(output_dir=tmp_path / "out", image_folder=root,
                                              image_size=8)).info
    assert info["class_names"] == list(CLASSES)
    assert {f["path"]: f["reason"] for f in info["skipped_files"]["files"]} == {
        ".cache/x.png": "in a hidden folder", "README.md": "not inside a class folder"}


def test_prepare_data_component_takes_an_image_folder_and_size(folder, tmp_path):
    from kfp import dsl

    from ampflow.components.prepare_data.component import prepare_data

    data = dsl.Dataset(uri=str(tmp_path / "data"))
    prepare_data(dataset="ampflow_digits", data=data, image_folder=str(folder),
                 image_size="16x12")
    assert data.metadata["image_shape"] == [16, 12, 3]
    assert data.metadata["num_classes"] == 3 and data.metadata["skipped_files"] == 2
    assert _info(tmp_path / "data")["config"]["image_size"] == [16, 12]


def test_prepare_data_cli_prepares_an_image_folder_at_h_w(folder, tmp_path, capsys):
    from ampflow.cli import main

    code = main(["prepare-data", "--image-folder", str(folder), "--image-size", "16", "12",
                 "--output-dir", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err
    info = _info(tmp_path / "out")
    assert info["image_shape"] == [16, 12, 3] and info["skipped_files"]["count"] == 2
    assert "skipped_files  2" in capsys.readouterr().out


def test_prepare_data_cli_bad_image_size_is_one_line_and_exit_2(folder, tmp_path, capsys):
    from ampflow.cli import main

    code = main(["prepare-data", "--image-folder", str(folder), "--image-size", "0",
                 "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Received: --image-size=(0,)" in err[0]
    assert not (tmp_path / "out").exists()
