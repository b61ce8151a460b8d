"""prepare-data: a TFDS dataset, an offline one, a folder of images or texts, or a text table.

Output (see docs/ARTIFACTS.md): `<output_dir>/tfds/` (a TFDS data_dir, unless an existing one
is given), `<output_dir>/config.json` (the resolved config) and `<output_dir>/dataset_info.json`,
written last so a reader never sees a dataset whose metadata is missing.

`dataset_info.json` says how every reader turns the stored images into model input:
`image_shape` [H, W, C] is the one shape the pipeline trains and serves at (`--image-size`, or
the dataset's own fixed size; C from images.model_channels), `source_image_shape` the stored
images' shape (null for a varying dimension), `resize` the rule (images.py), `holdout` the
seeded stratified test split of a dataset without a test split (holdout.py), `skipped_files`
the files of an image folder that are not in the dataset, and why.

A text dataset (`"modality": "text"`: a TFDS dataset with a string feature and a ClassLabel,
`--text-folder`, `--text-file`, `ampflow_rotten_tomatoes`) is described instead by its
`text_key` and `label_key`, and `skipped_files` counts every file or row left out by reason
(text.py holds the contract; text_folder.py and text_table.py the rules).
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

from ampflow.components.prepare_data.config import (
    DEFAULT_TEST_SPLIT,
    OFFLINE_DATASETS,
    PrepareDataConfig,
)
from ampflow.components.prepare_data.modalities import image_shape, preparing_of
from ampflow.data.dataset_info import DATASET_INFO_FILE
from ampflow.data.holdout import stratified_holdout
from ampflow.data.modality import MODALITY_IMAGE, MODALITY_TEXT, TEXT_FEATURE_NAMES
from ampflow.errors import AmpflowError, ConfigError, DatasetError
from ampflow.files import ensure_writable_dir, write_json_atomic

log = logging.getLogger(__name__)

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
        roles = _roles(builder.info, config)  # refuse what ampflow cannot train, before preparing
        _prepare(builder, config, data_dir)
        info = _describe(builder, config, data_dir, roles)
        write_json_atomic(output_dir / CONFIG_FILE, info["config"])
        write_json_atomic(output_dir / DATASET_INFO_FILE, info)  # last: it marks the dir complete
    preparing = preparing_of(roles.modality)
    preparing.log_skipped(info)
    preparing.log_ready(info)
    return PreparedData(output_dir=output_dir, info=info)


def _open_builder(config: PrepareDataConfig, data_dir: Path):
    if config.image_folder is not None:
        from ampflow.components.prepare_data.image_folder import open_image_folder

        return open_image_folder(config.image_folder, data_dir)
    if config.text_folder is not None:
        from ampflow.components.prepare_data.text_folder import open_text_folder

        return open_text_folder(config.text_folder, data_dir, config.max_text_bytes)
    if config.text_file is not None:
        from ampflow.components.prepare_data.text_table import open_text_table

        return open_text_table(config.text_file, data_dir, text_column=config.text_column,
                               label_column=config.label_column,
                               max_text_bytes=config.max_text_bytes)
    return _builder(config.dataset, data_dir)


def _builder(name: str, data_dir: Path):
    import tensorflow_datasets as tfds

    from ampflow.data import (  # noqa: F401  (registers their builders)
        offline_digits,
        offline_mnist,
        offline_rotten_tomatoes,
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
    if hasattr(builder, "require_source"):  # an offline builder whose file is fetched once
        builder.require_source()
    log.info("preparing %s into %s", builder.info.full_name, data_dir)
    tfds.disable_progress_bar()
    source = config.image_folder or config.text_folder or config.text_file or config.dataset
    try:
        builder.download_and_prepare()
    except AmpflowError:
        raise  # already one clear line
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


@dataclass(frozen=True)
class _Roles:
    """Which features are the example and the class: what ampflow trains on."""

    modality: str  # MODALITY_IMAGE or MODALITY_TEXT
    data_key: str  # the image or text feature
    label_key: str


def _roles(info, config: PrepareDataConfig) -> _Roles:
    """The image or text feature and the class feature, or one clear line why there are none.

    An `Image` feature at `image_key` makes an image dataset (checked by `image_shape`:
    a varying size needs --image-size), unless `--text-feature` asks for text. Otherwise the
    dataset must be a text classification one: a string feature (`_text_key`) and a
    `ClassLabel`.
    """
    import tensorflow_datasets as tfds

    features = info.features
    has_image = any(isinstance(f, tfds.features.Image) for f in features.values())
    if config.text_feature is None and has_image:
        image_shape(info, config)  # names a wrong --image-key, refuses a varying size
        return _Roles(MODALITY_IMAGE, config.image_key, config.label_key)
    label_key = _label_key(info, config)
    text_key = _text_key(info, config, label_key)
    if config.image_size is not None:
        raise ConfigError(
            f"image_size applies to images; {info.name} is a text dataset (its text is "
            f"{text_key!r}). Received: image_size={list(config.image_size)}")
    return _Roles(MODALITY_TEXT, text_key, label_key)


def _label_key(info, config: PrepareDataConfig) -> str:
    import tensorflow_datasets as tfds

    features = info.features
    class_labels = [k for k, f in features.items() if isinstance(f, tfds.features.ClassLabel)]
    if config.label_key in class_labels:
        return config.label_key
    if config.label_key not in features and len(class_labels) == 1:
        log.info("%s has no %r feature: its class feature is %r", info.name, config.label_key,
                 class_labels[0])
        return class_labels[0]
    raise ConfigError(
        f"dataset must be an image or text classification dataset (an Image or string "
        f"feature and a ClassLabel {config.label_key!r}). Received: dataset={info.name!r} with "
        f"features {_feature_summary(features)}")


def _text_key(info, config: PrepareDataConfig, label_key: str) -> str:
    features = info.features
    strings = [k for k, f in features.items() if k != label_key and _is_string(f)]
    if config.text_feature is not None:
        if config.text_feature not in strings:
            raise ConfigError(
                f"text_feature must name a string feature of {info.name}. Received: "
                f"text_feature={config.text_feature!r}; its string features are "
                f"{', '.join(strings) or 'none'}")
        return config.text_feature
    if not strings:
        raise ConfigError(
            f"dataset must be an image or text classification dataset (an Image or string "
            f"feature and a ClassLabel). Received: dataset={info.name!r} with features "
            f"{_feature_summary(features)}")
    preferred = [name for name in TEXT_FEATURE_NAMES if name in strings]
    if len(strings) > 1 and not preferred:
        raise ConfigError(
            f"{info.name} has several string features ({', '.join(strings)}): pass "
            "--text-feature NAME (text_feature) to say which holds the text")
    key = strings[0] if len(strings) == 1 else preferred[0]
    if len(strings) > 1:
        log.info("%s has string features %s: using %r (--text-feature chooses another)",
                 info.name, strings, key)
    return key


def _is_string(feature) -> bool:
    """A scalar string feature (`Text`, or a `Tensor` of shape () and dtype string)."""
    import tensorflow_datasets as tfds

    return (isinstance(feature, tfds.features.Tensor) and tuple(feature.shape) == ()
            and np.dtype(feature.np_dtype) == np.dtype(object))


def _feature_summary(features) -> str:
    """'text (Text), score (Tensor float32)': the features, on one line."""
    def kind(f) -> str:
        name = type(f).__name__
        if name == "Tensor":
            dtype = np.dtype(f.np_dtype)
            return f"Tensor {'string' if dtype == np.dtype(object) else dtype.name}"
        return name
    return ", ".join(f"{k} ({kind(f)})" for k, f in features.items())


def _describe(builder, config: PrepareDataConfig, data_dir: Path,
              roles: _Roles) -> dict[str, Any]:
    """dataset_info.json: what both kinds share, then the image or the text facts."""
    info = builder.info
    label_feature = info.features[roles.label_key]
    splits, specs, holdout = _splits(builder, config, roles)
    common = {
        "name": info.name,
        "version": str(info.version),
        "full_name": info.full_name,
        "tfds_data_dir": os.fspath(Path(data_dir).resolve()),
        "modality": roles.modality,
        "splits": splits,
        "split_specs": specs,
        "holdout": holdout,
        "num_classes": int(label_feature.num_classes),
        "class_names": list(label_feature.names),
        "label_key": roles.label_key,
        "config": _config_record(config),
    }
    return {**common, **preparing_of(roles.modality).describe(info, config, roles.data_key)}


def _config_record(config: PrepareDataConfig) -> dict[str, Any]:
    """The config as it ran (config.json).

    `dataset` is null when a folder or table was prepared instead: its default (the offline
    digits) was not read, and a text folder's record named `ampflow_digits`.
    """
    record = {k: _jsonable(v) for k, v in dataclasses.asdict(config).items()}
    if config.image_folder or config.text_folder or config.text_file:
        record["dataset"] = None
    return record


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return os.fspath(value)
    return list(value) if isinstance(value, tuple) else value


def _splits(builder, config: PrepareDataConfig, roles: _Roles):
    """(example counts, TFDS split specs, held-out split or None) of the train and test roles."""
    info = builder.info
    train = _num_examples(info, "train", config.train_split)
    specs = {"train": config.train_split, "test": config.test_split}
    if config.test_split == DEFAULT_TEST_SPLIT and DEFAULT_TEST_SPLIT not in info.splits:
        holdout = _holdout(builder, config, train, roles)
        specs["test"] = config.train_split
        test = len(holdout["test_indices"])
        return {"train": train - test, "test": test}, specs, holdout
    test = _num_examples(info, "test", config.test_split)
    if preparing_of(roles.modality).requires_labels:
        _require_labelled(builder, config.test_split, "test_split", roles)
    specs["train"] = _train_spec_without_test(info, config)
    if specs["train"] != config.train_split:
        train = sum(b - a for _, a, b in _ranges(info, specs["train"]))
    return {"train": train, "test": test}, specs, None


def _require_labelled(builder, spec: str, role: str, roles: _Roles,
                      labels: np.ndarray | None = None) -> None:
    """Refuse a split whose examples carry no class (TFDS's -1: GLUE's test splits)."""
    labels = _read_labels(builder, spec, roles) if labels is None else labels
    unlabelled = int(np.sum(labels < 0))
    if unlabelled:
        others = [s for s in builder.info.splits.keys() if s != spec]
        raise ConfigError(
            f"{role} must be labelled. Received: {role}={spec!r} of {builder.info.name} with "
            f"{unlabelled} of {len(labels)} examples unlabelled (label -1, as in GLUE's test "
            f"splits): pass --{role.replace('_', '-')} with a labelled split "
            f"({', '.join(sorted(others)) or 'none other'}, or a slice of train)")


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


def _holdout(builder, config: PrepareDataConfig, num_examples: int,
             roles: _Roles) -> dict[str, Any]:
    """Hold out `test_fraction` of each class of the training split (holdout.py's rule)."""
    labels = _read_labels(builder, config.train_split, roles)
    if len(labels) != num_examples:
        raise DatasetError(f"read {len(labels)} labels from {config.train_split!r} of "
                           f"{builder.info.name}, expected {num_examples}")
    if preparing_of(roles.modality).requires_labels:
        _require_labelled(builder, config.train_split, "train_split", roles, labels)
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


def _read_labels(builder, spec: str, roles: _Roles) -> np.ndarray:
    """The labels of a split spec in TFDS read order, without decoding an image."""
    decoders = preparing_of(roles.modality).label_only_decoders(roles.data_key)
    ds = builder.as_dataset(split=spec, shuffle_files=False, decoders=decoders)
    batches = [b for b in ds.map(lambda ex: ex[roles.label_key]).batch(4096)
               .as_numpy_iterator()]
    return np.concatenate(batches) if batches else np.zeros(0, np.int64)


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
