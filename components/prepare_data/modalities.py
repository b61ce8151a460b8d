"""prepare-data's side of the modality seam: what a prepared dir records and logs per modality.

The step names the modality from the source's features (step.py's `_roles`) and then asks
`preparing_of(modality)` once for what differs: dataset_info.json's facts (`describe`), the
split reading that skips decoding the examples, whether a split's labels must be checked
(text datasets ship unlabelled test splits), the logs and the summaries. A new modality adds
a class here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.data import images
from ampflow.data.modality import MODALITY_IMAGE, MODALITY_TEXT
from ampflow.errors import ConfigError, DatasetError

log = logging.getLogger("ampflow.components.prepare_data.step")  # the step's own log lines

# `config` below is a config.PrepareDataConfig.


class ImagePreparing:
    """Images: resized to one shape; files that are not images are skipped and listed."""

    name = MODALITY_IMAGE
    requires_labels = False  # image datasets label every split

    def describe(self, info, config, data_key: str) -> dict[str, Any]:
        """dataset_info.json's image facts: the shape trained at, the source's, the skips."""
        features = info.features
        metadata = info.metadata or {}
        skipped = list(metadata.get("skipped_files", []))
        return {
            "image_folder": (os.fspath(Path(config.image_folder).expanduser().resolve())
                             if config.image_folder is not None else None),
            "image_shape": image_shape(info, config),
            "source_image_shape": [None if d is None else int(d)
                                   for d in features[config.image_key].shape],
            "resize": {"method": images.RESIZE_METHOD, "antialias": images.RESIZE_ANTIALIAS,
                       "keeps_aspect_ratio": images.KEEPS_ASPECT_RATIO},
            "image_dtype": np.dtype(features[config.image_key].np_dtype).name,
            "image_key": config.image_key,
            "skipped_files": {"count": len(skipped), "files": skipped},
        }

    def label_only_decoders(self, data_key: str):
        """TFDS decoders that read the labels without decoding an image."""
        import tensorflow_datasets as tfds

        return {data_key: tfds.decode.SkipDecoding()}

    def log_ready(self, info: dict[str, Any]) -> None:
        log.info("dataset ready: %s %s at image shape %s", info["name"], info["splits"],
                 info["image_shape"])

    def log_skipped(self, info: dict[str, Any]) -> None:
        skipped = info["skipped_files"]
        if not skipped["count"]:
            return
        from ampflow.components.prepare_data.image_folder import describe_skipped

        log.warning("skipped %d files of %s (unreadable, corrupt or not an image; all listed in "
                    "dataset_info.json under skipped_files): %s", skipped["count"],
                    info["image_folder"], describe_skipped(skipped["files"]))

    def shape(self, info: dict[str, Any]) -> dict[str, Any]:
        """What a summary says of the examples' shape."""
        return {"image_shape": info["image_shape"]}


class TextPreparing:
    """Texts: kept as written; every file or row left out is counted by reason."""

    name = MODALITY_TEXT
    requires_labels = True  # GLUE-style test splits carry -1 for every example

    def describe(self, info, config, data_key: str) -> dict[str, Any]:
        """The text facts: the feature, the source, and every file or row left out, by reason."""
        metadata = info.metadata or {}
        listed = list(metadata.get("skipped_files", []))
        by_reason = dict(metadata.get("skipped_by_reason") or metadata.get("dropped") or {})
        source = metadata.get("text_source")
        return {
            "text_key": data_key,
            "text_dtype": "string",
            "text_source": source,
            "text_source_kind": metadata.get("text_source_kind"),
            "text_source_details": metadata.get("details"),
            "max_text_bytes": config.max_text_bytes if source else None,
            "image_shape": None,  # not an image dataset: readers that branch on it see so
            "skipped_files": {"count": int(sum(by_reason.values())), "by_reason": by_reason,
                              "listed": len(listed), "files": listed},
        }

    def label_only_decoders(self, data_key: str):
        return None  # a text is cheap to read

    def log_ready(self, info: dict[str, Any]) -> None:
        log.info("dataset ready: %s %s, text feature %r, %d classes", info["name"],
                 info["splits"], info["text_key"], info["num_classes"])

    def log_skipped(self, info: dict[str, Any]) -> None:
        skipped = info["skipped_files"]
        if not skipped["count"]:
            return
        from ampflow.components.prepare_data.image_folder import describe_skipped

        reasons = ", ".join(f"{n} {r}" for r, n in skipped["by_reason"].items())
        where = info.get("text_source") or info["name"]
        listed = [{**s, "path": f"{s['path']}:{s['line']}" if "line" in s else s["path"]}
                  for s in skipped["files"]]
        log.warning("left out %d texts of %s (%s; in dataset_info.json under skipped_files)%s",
                    skipped["count"], where, reasons,
                    f": {describe_skipped(listed)}" if listed else "")

    def shape(self, info: dict[str, Any]) -> dict[str, Any]:
        """What a summary says of the examples' shape: the text feature."""
        return {"text_key": info["text_key"]}


PREPARING = {m.name: m for m in (ImagePreparing(), TextPreparing())}


def preparing_of(modality: str):
    """prepare-data's side of `modality` (dataset_info.json's `modality`)."""
    return PREPARING[modality]


def image_shape(info, config) -> list[int]:
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
