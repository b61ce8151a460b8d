"""prepare-data: any TFDS catalog dataset, or the offline default, into a data_dir.

Output (see docs/ARTIFACTS.md): `<output_dir>/tfds/` (a TFDS data_dir, unless an existing one
is given), `<output_dir>/config.json` (the resolved config) and `<output_dir>/dataset_info.json`,
written last so a reader never sees a dataset
whose metadata is missing.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.components.prepare_data.config import OFFLINE_DATASETS, PrepareDataConfig
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
    """Prepare `config.dataset` with the TFDS builder API and write `dataset_info.json`."""
    import tensorflow_datasets as tfds

    output_dir = ensure_writable_dir(config.output_dir, "output_dir")
    data_dir = ensure_writable_dir(config.resolved_tfds_data_dir, "tfds_data_dir")
    builder = _builder(config.dataset, data_dir)
    if not _is_prepared(builder):
        _require_network_for(builder, data_dir)
        log.info("preparing %s into %s", builder.info.full_name, data_dir)
        tfds.disable_progress_bar()
        try:
            builder.download_and_prepare()
        except Exception as e:  # TFDS raises many types; the user needs one clear line
            raise DatasetError(
                f"Could not prepare dataset {config.dataset!r} in {data_dir}: {e}"
            ) from e
    else:
        log.info("%s already prepared in %s; reusing it", builder.info.full_name, data_dir)
    info = _describe(builder, config, data_dir)
    write_json_atomic(output_dir / CONFIG_FILE, info["config"])
    write_json_atomic(output_dir / DATASET_INFO_FILE, info)  # last: it marks the dir complete
    log.info("dataset ready: %s %s", info["name"], info["splits"])
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
            f"dataset must be a TFDS catalog name or one of {OFFLINE_DATASETS}. "
            f"Received: dataset={name!r}.{hint}"
        )
    try:
        return tfds.builder(name, data_dir=os.fspath(data_dir))
    except Exception as e:
        raise DatasetError(f"Could not open TFDS builder {name!r}: {e}") from e


def _is_prepared(builder) -> bool:
    return Path(os.fspath(builder.data_dir), "dataset_info.json").is_file()


def _require_network_for(builder, data_dir: Path) -> None:
    """Fail fast, with the fix, when a dataset needs a download and there is no network."""
    if builder.name in OFFLINE_DATASETS:
        return
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


def _describe(builder, config: PrepareDataConfig, data_dir: Path) -> dict[str, Any]:
    info = builder.info
    features = info.features
    for key in (config.image_key, config.label_key):
        if key not in features:
            raise ConfigError(
                f"image_key/label_key must name features of {info.name}. Received: {key!r}; "
                f"features are {sorted(features.keys())}"
            )
    image_shape = list(features[config.image_key].shape)
    if any(d is None for d in image_shape):
        raise DatasetError(
            f"{info.name} has images of variable shape {image_shape}; ampflow needs a fixed "
            "image shape for serving signatures."
        )
    label_feature = features[config.label_key]
    splits = {}
    for role, spec in (("train", config.train_split), ("test", config.test_split)):
        try:
            splits[role] = int(info.splits[spec].num_examples)
        except (KeyError, ValueError) as e:
            raise ConfigError(
                f"{role}_split must be a split of {info.name} ({sorted(info.splits.keys())}). "
                f"Received: {spec!r}"
            ) from e
    return {
        "name": info.name,
        "version": str(info.version),
        "full_name": info.full_name,
        "tfds_data_dir": os.fspath(Path(data_dir).resolve()),
        "splits": splits,
        "split_specs": {"train": config.train_split, "test": config.test_split},
        "image_shape": image_shape,
        "image_dtype": np.dtype(features[config.image_key].np_dtype).name,
        "num_classes": int(label_feature.num_classes),
        "class_names": list(label_feature.names),
        "image_key": config.image_key,
        "label_key": config.label_key,
        "config": {k: os.fspath(v) if isinstance(v, Path) else v
                   for k, v in dataclasses.asdict(config).items()},
    }
