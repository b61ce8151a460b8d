"""prepare-data: any TFDS dataset, the offline default, or a folder of images, into a data_dir.

Output (see docs/ARTIFACTS.md): `<output_dir>/tfds/` (a TFDS data_dir, unless an existing one
is given), `<output_dir>/config.json` (the resolved config) and `<output_dir>/dataset_info.json`,
written last so a reader never sees a dataset whose metadata is missing.

`dataset_info.json` says how every reader turns the stored images into model input:
`image_shape` [H, W, C] is the one shape the pipeline trains and serves at (`--image-size`, or
the dataset's own fixed size; C from images.model_channels), `source_image_shape` the stored
images' shape (null for a varying dimension), `resize` the rule (images.py), `holdout` the
seeded stratified test split of a dataset without a test split (holdout.py), `skipped_files`
the files of an image folder that are not in the dataset, and why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.components.prepare_data import images
from ampflow.components.prepare_data.config import (
    DEFAULT_TEST_SPLIT,
    OFFLINE_DATASETS,
    PrepareDataConfig,
)
from ampflow.components.prepare_data.holdout import stratified_holdout
from ampflow.errors import ConfigError, DatasetError
from ampflow.files import ensure_writable_dir, read_json, write_json_atomic

log = logging.getLogger(__name__)

DATASET_INFO_FILE = "dataset_info.json"
CONFIG_FILE = "config.json"
# Where a catalog dataset's files come from; probed once so an offline machine fails fast.
_DOWNLOAD_PROBE = ("storage.googleapis.com", 443)


@dataclass(frozen=True)
class PreparedData:
    """Where the prepared dataset is and what it holds."""

    output_dir: Path
    info: dict[str, Any]


def run_prepare_data(config: PrepareDataConfig) -> PreparedData:
    """Prepare `config.dataset` (or `config.image_folder`) with TFDS; write `dataset_info.json`.

    A failure leaves no `dataset_info.json` (it is written last) and no empty directory that
    this run created.
    """
    with _pruned_on_failure(config.output_dir, config.resolved_tfds_data_dir):
        output_dir = ensure_writable_dir(config.output_dir, "output_dir")
        data_dir = ensure_writable_dir(config.resolved_tfds_data_dir, "tfds_data_dir")
        builder = _open_builder(config, data_dir)
        _image_shape(builder.info, config)  # refuse a variable size before any preparation
        _prepare(builder, config, data_dir)
        info = _describe(builder, config, data_dir)
        write_json_atomic(output_dir / CONFIG_FILE, info["config"])
        write_json_atomic(output_dir / DATASET_INFO_FILE, info)  # last: it marks the dir complete
    _log_skipped(info)
    log.info("dataset ready: %s %s at image shape %s", info["name"], info["splits"],
             info["image_shape"])
    return PreparedData(output_dir=output_dir, info=info)


def load_dataset_info(prepared_dir: str | os.PathLike) -> dict[str, Any]:
    """Read `dataset_info.json` from a prepared dir; a missing one is a clear DatasetError."""
    path = Path(prepared_dir) / DATASET_INFO_FILE
    if not path.is_file():
        raise DatasetError(
            f"{prepared_dir} is not a prepared dataset: expected {DATASET_INFO_FILE} in it "
            "(run `ampflow prepare-data` first)."
        )
    try:
        return read_json(path)
    except ValueError as e:
        raise DatasetError(f"{path} is corrupt: {e}") from e


def _open_builder(config: PrepareDataConfig, data_dir: Path):
    if config.image_folder is not None:
        from ampflow.components.prepare_data.image_folder import open_image_folder

        return open_image_folder(config.image_folder, data_dir)
    return _builder(config.dataset, data_dir)


def _builder(name: str, data_dir: Path):
    import tensorflow_datasets as tfds

    from ampflow.components.prepare_data import (  # noqa: F401  (registers their builders)
        offline_digits,
        offline_mnist,
    )

    base_name = name.split(":")[0].split("/")[0]
    known = set(tfds.list_builders(with_community_datasets=False))
    if base_name not in known:
        close = difflib.get_close_matches(base_name, sorted(known), n=3, cutoff=0.6)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"dataset must be a TFDS catalog name or one of {', '.join(OFFLINE_DATASETS)}. "
            f"Received: dataset={name!r}.{hint}"
        )
    try:
        return tfds.builder(name, data_dir=os.fspath(data_dir))
    except Exception as e:
        raise DatasetError(f"Could not open TFDS builder {name!r}: {e}") from e


def _prepare(builder, config: PrepareDataConfig, data_dir: Path) -> None:
    import tensorflow_datasets as tfds

    if _is_prepared(builder):
        log.info("%s already prepared in %s; reusing it", builder.info.full_name, data_dir)
        return
    _require_network_for(builder, data_dir)
    log.info("preparing %s into %s", builder.info.full_name, data_dir)
    tfds.disable_progress_bar()
    source = config.image_folder or config.dataset
    try:
        builder.download_and_prepare()
    except Exception as e:  # TFDS raises many types; the user needs one clear line
        raise DatasetError(f"Could not prepare dataset {str(source)!r} in {data_dir}: {e}") from e


def _is_prepared(builder) -> bool:
    return Path(os.fspath(builder.data_dir), "dataset_info.json").is_file()


def _require_network_for(builder, data_dir: Path) -> None:
    """Fail fast, with the fix, when a dataset needs a download and there is no network."""
    if not _is_catalog_builder(builder):
        return  # ours (offline, an image folder) or one a user registered: no download
    host, port = _DOWNLOAD_PROBE
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as e:
        raise DatasetError(
            f"dataset {builder.name!r} is not prepared in {data_dir} and needs a download, "
            f"but the network is unreachable ({e}). Prepare it on a machine with network "
            f"(`ampflow prepare-data --dataset {builder.name} --output-dir DIR`), copy DIR/tfds "
            f"here and pass it as --tfds-data-dir, or use an offline dataset "
            f"(--dataset {' or '.join(OFFLINE_DATASETS)})."
        ) from e


def _is_catalog_builder(builder) -> bool:
    """Whether the builder comes from the TFDS catalog (whose data is downloaded)."""
    return type(builder).__module__.startswith("tensorflow_datasets.")


def _describe(builder, config: PrepareDataConfig, data_dir: Path) -> dict[str, Any]:
    info = builder.info
    features = info.features
    image_shape = _image_shape(info, config)
    source_shape = [None if d is None else int(d) for d in features[config.image_key].shape]
    label_feature = features[config.label_key]
    splits, specs, holdout = _splits(builder, config)
    metadata = info.metadata or {}
    skipped = list(metadata.get("skipped_files", []))
    return {
        "name": info.name,
        "version": str(info.version),
        "full_name": info.full_name,
        "tfds_data_dir": os.fspath(Path(data_dir).resolve()),
        "image_folder": (os.fspath(Path(config.image_folder).expanduser().resolve())
                         if config.image_folder is not None else None),
        "splits": splits,
        "split_specs": specs,
        "holdout": holdout,
        "image_shape": image_shape,
        "source_image_shape": source_shape,
        "resize": {"method": images.RESIZE_METHOD, "antialias": images.RESIZE_ANTIALIAS,
                   "keeps_aspect_ratio": images.KEEPS_ASPECT_RATIO},
        "image_dtype": np.dtype(features[config.image_key].np_dtype).name,
        "num_classes": int(label_feature.num_classes),
        "class_names": list(label_feature.names),
        "image_key": config.image_key,
        "label_key": config.label_key,
        "skipped_files": {"count": len(skipped), "files": skipped},
        "config": {k: _jsonable(v) for k, v in dataclasses.asdict(config).items()},
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return os.fspath(value)
    return list(value) if isinstance(value, tuple) else value


def _image_shape(info, config: PrepareDataConfig) -> list[int]:
    """[H, W, C]: the shape the pipeline trains and serves at (resized from the source's)."""
    features = info.features
    for key in (config.image_key, config.label_key):
        if key not in features:
            raise ConfigError(
                f"image_key/label_key must name features of {info.name}. Received: {key!r}; "
                f"features are {sorted(features.keys())}"
            )
    feature = features[config.image_key]
    source = list(feature.shape)
    dtype = np.dtype(feature.np_dtype).name
    if len(source) != 3 or dtype != "uint8":
        raise DatasetError(
            f"{info.name}'s {config.image_key!r} must be uint8 images [H, W, C]. Received: "
            f"shape {source}, dtype {dtype}")
    if config.image_size is not None:
        height, width = config.image_size
    elif source[0] is None or source[1] is None:
        raise DatasetError(
            f"{info.name} has images of varying size {source}: pass --image-size H W (or one "
            "number for a square) to fix the size ampflow trains and serves at; images are "
            f"resized in the input pipeline ({images.RESIZE_METHOD}, antialiased, aspect ratio "
            "not kept).")
    else:
        height, width = source[0], source[1]
    return [int(height), int(width), images.model_channels(source[2])]


def _splits(builder, config: PrepareDataConfig):
    """(example counts, TFDS split specs, held-out split or None) of the train and test roles."""
    info = builder.info
    train = _num_examples(info, "train", config.train_split)
    specs = {"train": config.train_split, "test": config.test_split}
    if config.test_split == DEFAULT_TEST_SPLIT and DEFAULT_TEST_SPLIT not in info.splits:
        holdout = _holdout(builder, config, train)
        specs["test"] = config.train_split
        test = len(holdout["test_indices"])
        return {"train": train - test, "test": test}, specs, holdout
    test = _num_examples(info, "test", config.test_split)
    specs["train"] = _train_spec_without_test(info, config)
    if specs["train"] != config.train_split:
        train = sum(b - a for _, a, b in _ranges(info, specs["train"]))
    return {"train": train, "test": test}, specs, None


def _train_spec_without_test(info, config: PrepareDataConfig) -> str:
    """The training spec, minus the test examples when a whole split was named for training.

    `--test-split train[90%:]` with the default `--train-split train` trains on `train[:90%]`
    (the examples of `train` outside the test spec, as absolute TFDS slices); any other
    overlap between the two specs is refused: it would report test accuracy on training data.
    """
    train = _ranges(info, config.train_split)
    test = _ranges(info, config.test_split)
    overlap = [(name, max(a, c), min(b, d)) for name, a, b in train for other, c, d in test
               if name == other and max(a, c) < min(b, d)]
    if not overlap:
        return config.train_split
    rest = _complement(config.train_split, int(info.splits[config.train_split].num_examples),
                       [(a, b) for name, a, b in test if name == config.train_split]) \
        if config.train_split in info.splits else ""
    if not rest:
        raise ConfigError(
            "train_split and test_split must not overlap (test accuracy on training data). "
            f"Received: train_split={config.train_split!r}, test_split={config.test_split!r}; "
            f"they share examples {overlap[0][1]}..{overlap[0][2] - 1} of {overlap[0][0]!r}")
    log.info("test_split %r is part of train_split %r: training on the rest, %r",
             config.test_split, config.train_split, rest)
    return rest


def _ranges(info, spec: str) -> list[tuple[str, int, int]]:
    """The absolute [from, to) example ranges a TFDS split spec reads, per split name."""
    import tensorflow_datasets as tfds

    instructions = tfds.core.ReadInstruction.from_spec(spec).to_absolute(info.splits)
    return [(i.splitname, int(i.from_ or 0),
             int(info.splits[i.splitname].num_examples if i.to is None else i.to))
            for i in instructions]


def _complement(name: str, size: int, taken: list[tuple[int, int]]) -> str:
    """A TFDS spec of the examples of split `name` outside `taken` ("" when none are left)."""
    parts, start = [], 0
    for a, b in sorted(taken):
        if a > start:
            parts.append(f"{name}[{start}:{a}]")
        start = max(start, b)
    if start < size:
        parts.append(f"{name}[{start}:]")
    return "+".join(parts)


def _num_examples(info, role: str, spec: str) -> int:
    try:
        return int(info.splits[spec].num_examples)
    except (KeyError, ValueError) as e:
        raise ConfigError(
            f"{role}_split must be a split of {info.name} ({sorted(info.splits.keys())}). "
            f"Received: {spec!r}"
        ) from e


def _holdout(builder, config: PrepareDataConfig, num_examples: int) -> dict[str, Any]:
    """Hold out `test_fraction` of each class of the training split (holdout.py's rule)."""
    labels = _read_labels(builder, config)
    if len(labels) != num_examples:
        raise DatasetError(f"read {len(labels)} labels from {config.train_split!r} of "
                           f"{builder.info.name}, expected {num_examples}")
    test = stratified_holdout(labels, config.test_fraction, config.split_seed)
    log.info("%s has no %r split: holding out %d of %d examples of %r (%.0f%% of each class, "
             "seed %d)", builder.info.name, DEFAULT_TEST_SPLIT, len(test), num_examples,
             config.train_split, 100 * config.test_fraction, config.split_seed)
    return {
        "from_split": config.train_split,
        "num_examples": int(num_examples),
        "fraction": float(config.test_fraction),
        "seed": int(config.split_seed),
        "rule": "per class, in label order: the first round(n * fraction) (at least 1 of a "
                "class of 2 or more) of numpy.random.default_rng(seed).permutation of the "
                "class's example numbers, numbered in TFDS read order (shuffle_files=False)",
        "test_indices": [int(i) for i in test],
    }


def _read_labels(builder, config: PrepareDataConfig) -> np.ndarray:
    """The labels of the training split in TFDS read order, without decoding an image."""
    import tensorflow_datasets as tfds

    ds = builder.as_dataset(split=config.train_split, shuffle_files=False,
                            decoders={config.image_key: tfds.decode.SkipDecoding()})
    batches = [b for b in ds.map(lambda ex: ex[config.label_key]).batch(4096)
               .as_numpy_iterator()]
    return np.concatenate(batches) if batches else np.zeros(0, np.int64)


def _log_skipped(info: dict[str, Any]) -> None:
    skipped = info["skipped_files"]
    if skipped["count"]:
        from ampflow.components.prepare_data.image_folder import describe_skipped

        log.warning("skipped %d files of %s (unreadable, corrupt or not an image; all listed in "
                    "dataset_info.json under skipped_files): %s", skipped["count"],
                    info["image_folder"], describe_skipped(skipped["files"]))


@contextlib.contextmanager
def _pruned_on_failure(*paths: str | os.PathLike):
    """On failure, remove the directories this run created, if nothing but directories."""
    created = [p for p in (_first_missing(Path(p)) for p in paths) if p is not None]
    try:
        yield
    except BaseException:
        for path in created:
            _remove_empty_dirs(path)
        raise


def _first_missing(path: Path) -> Path | None:
    """The topmost ancestor of `path` (itself included) that does not exist yet."""
    path = path.absolute()
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def _remove_empty_dirs(path: Path) -> None:
    """Remove `path` and the directories under it, bottom-up, wherever they hold no file."""
    if not path.is_dir():
        return
    for dirpath, _, _ in sorted(os.walk(path), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)  # fails, and keeps the dir, when something is in it
