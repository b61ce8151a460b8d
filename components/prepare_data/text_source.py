"""A text folder or table, read once, as a TFDS dataset: the same code path as a catalog one.

`text_folder.py` and `text_table.py` read the files and decide what is kept; this module holds
what they share: the result of a read (`TextScan`), the skip record, and the TFDS builders
(`ampflow_text_folder`, `ampflow_text_file`) that store the kept examples as `text`
(`tfds.features.Text`) + `label` (`ClassLabel`), the contract of text.py.

As for an image folder (image_folder.py), the builder's config name carries a fingerprint of
the source (each file's path, size and modification time, and the settings that decide what is
kept): an unchanged source is reused without reading a file, a changed one is prepared afresh
beside the old one. Every left-out file or row is in the dataset's metadata (`skipped_files`,
with a count per reason), which `prepare-data` copies to dataset_info.json: nothing is dropped
without a count. A source with no usable input (no class folders, one class, no readable text,
an unknown column) is a configuration error (DatasetConfigError, ConfigError): exit 2, nothing
ran (src/ampflow/errors.py's rule), and the message names the flag.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import tensorflow_datasets as tfds

from ampflow.components.prepare_data.image_folder import _without_absl_warning
from ampflow.data.modality import (
    LABEL_FEATURE,
    MAX_LISTED_SKIPS,
    SKIP_NOT_UTF8,
    TEXT_FEATURE,
)
from ampflow.data.offline_digits import OfflineBuilder
from ampflow.errors import DatasetConfigError

log = logging.getLogger(__name__)

BUILDER_VERSION = "1.0.0"


@dataclass(frozen=True)
class TextSourceKey:
    """What identifies a source's content without reading it: the reuse check."""

    kind: str  # "folder" or "file"
    root: Path  # the folder, or the table file
    fingerprint: str

    @property
    def config_name(self) -> str:
        """The TFDS config name: the source's name (for people) + its fingerprint (for reuse)."""
        slug = re.sub(r"[^a-z0-9]+", "_", self.root.name.lower()).strip("_")[:40] or self.kind
        return f"{slug}_{self.fingerprint[:16]}"


@dataclass(frozen=True)
class TextExample:
    """One kept example: a stable key (path, or file:line), its split, class id and text."""

    key: str
    split: str
    label: int
    text: str


@dataclass
class SkipLog:
    """Every left-out file or row: counted by reason, listed up to MAX_LISTED_SKIPS."""

    items: list[dict] = field(default_factory=list)
    by_reason: Counter = field(default_factory=Counter)

    def add(self, path: str, reason: str, detail: str = "", line: int | None = None) -> None:
        """Count one left-out item; list it while the list is short."""
        self.by_reason[reason] += 1
        if len(self.items) < MAX_LISTED_SKIPS:
            item = {"path": path, "reason": reason}
            if line is not None:
                item["line"] = line
            if detail:
                item["detail"] = detail
            self.items.append(item)

    @property
    def count(self) -> int:
        """How many items were left out (all of them, listed or not)."""
        return sum(self.by_reason.values())


@dataclass(frozen=True)
class TextScan:
    """A source read once: its classes, the kept examples and the left-out items."""

    key: TextSourceKey
    class_names: tuple[str, ...]
    examples: tuple[TextExample, ...]
    skipped: SkipLog
    details: dict  # layout (folder) or format and columns (table), for dataset_info.json


def fingerprint(kind: str, root: Path, paths: list[Path], settings: dict) -> str:
    """sha256 of the builder version, the settings and each file's path, size and mtime."""
    digest = hashlib.sha256(f"{BUILDER_VERSION}\n{kind}\n{sorted(settings.items())}\n".encode())
    for path in sorted(paths):
        rel = path.relative_to(root).as_posix() if path != root else path.name
        try:
            st = path.stat()
            digest.update(f"{rel}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
        except OSError:  # a broken link: it will be listed as unreadable
            digest.update(f"{rel}\t-\n".encode())
    return digest.hexdigest()


def decode_utf8(data: bytes) -> str | tuple[str, str]:
    """The text of `data` (a leading BOM dropped), or (SKIP_NOT_UTF8, where it fails)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return SKIP_NOT_UTF8, f"byte 0x{data[e.start]:02x} at offset {e.start}"


def prepared_builder(key: TextSourceKey, data_dir: Path):
    """The builder already prepared from this exact source content, or None."""
    builder_dir = Path(data_dir) / builder_name(key.kind) / key.config_name / BUILDER_VERSION
    if (builder_dir / "dataset_info.json").is_file():
        log.info("text %s %s unchanged since it was prepared into %s; reusing it", key.kind,
                 key.root, builder_dir)
        return tfds.builder_from_directory(os.fspath(builder_dir))
    return None


def builder_name(kind: str) -> str:
    """The TFDS name of a source kind's builder."""
    return {"folder": AmpflowTextFolder.name, "file": AmpflowTextFile.name}[kind]


def make_builder(scan: TextScan, data_dir: Path):
    """The TFDS builder that stores `scan`'s kept examples."""
    cls = AmpflowTextFolder if scan.key.kind == "folder" else AmpflowTextFile
    return cls(scan=scan, data_dir=os.fspath(data_dir))


def require_two_classes(what: str, source: Path, scan_classes: tuple[str, ...],
                        examples: tuple[TextExample, ...], skipped: SkipLog) -> None:
    """A classifier needs kept training examples of two classes: one clear line if not."""
    if not examples:
        raise DatasetConfigError(
            f"{what} must hold at least one readable UTF-8 text. Received: {source} with "
            f"{skipped.count} left out ({describe_reasons(skipped)})")
    trained = sorted({scan_classes[e.label] for e in examples if e.split == "train"})
    if len(trained) < 2:
        raise DatasetConfigError(
            f"{what} must hold training texts of at least 2 classes (a classifier needs two). "
            f"Received: texts only of {trained} in {source}")
    missing = sorted(set(scan_classes) - set(trained))
    if missing:
        log.warning("classes with no kept training text (kept as class ids): %s", missing)


def describe_reasons(skipped: SkipLog) -> str:
    """"3 not UTF-8, 1 empty": the counts per reason, on one line."""
    return ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.by_reason.items())) or "none"


class _TextSourceBuilder(OfflineBuilder, skip_registration=True):
    """The kept texts of one source (one config per source content)."""

    VERSION = tfds.core.Version(BUILDER_VERSION)
    KIND = ""

    def __init__(self, *, scan: TextScan, **kwargs):
        self._scan = scan
        self.SOURCE = f"the text {self.KIND} {scan.key.root}"
        config = tfds.core.BuilderConfig(
            name=scan.key.config_name,
            description=f"The texts of {scan.key.root} (fingerprint {scan.key.fingerprint}).")
        with _without_absl_warning("Using custom data configuration"):
            super().__init__(config=config, **kwargs)  # one config per source: not a surprise

    def _info(self) -> tfds.core.DatasetInfo:
        scan = self._scan
        return tfds.core.DatasetInfo(
            builder=self,
            description=f"A text {self.KIND}: {scan.key.root}.",
            features=tfds.features.FeaturesDict({
                TEXT_FEATURE: tfds.features.Text(),
                LABEL_FEATURE: tfds.features.ClassLabel(names=list(scan.class_names)),
            }),
            supervised_keys=(TEXT_FEATURE, LABEL_FEATURE),
            metadata=tfds.core.MetadataDict(
                text_source=os.fspath(scan.key.root),
                text_source_kind=self.KIND,
                fingerprint=scan.key.fingerprint,
                details=scan.details,
                skipped_files=list(scan.skipped.items),
                skipped_count=scan.skipped.count,
                skipped_by_reason=dict(sorted(scan.skipped.by_reason.items())),
            ),
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        del dl_manager  # nothing to download: the texts are on this machine
        splits = sorted({e.split for e in self._scan.examples})
        return {split: self._generate_examples(split) for split in splits}

    def _generate_examples(self, split: str):
        from ampflow.progress import track

        examples = [e for e in self._scan.examples if e.split == split]
        for e in track(examples, len(examples), f"prepare {split}", unit="example"):
            yield e.key, {TEXT_FEATURE: e.text, LABEL_FEATURE: e.label}


class AmpflowTextFolder(_TextSourceBuilder, skip_registration=True):
    """`--text-folder`: one sub-folder per class, one .txt file per example."""

    KIND = "folder"
    RELEASE_NOTES = {BUILDER_VERSION: "Class sub-folders of .txt files, optional train/test."}


class AmpflowTextFile(_TextSourceBuilder, skip_registration=True):
    """`--text-file`: a .csv, .tsv or .jsonl table with a text and a label column."""

    KIND = "file"
    RELEASE_NOTES = {BUILDER_VERSION: "A CSV/TSV/JSONL table, a text and a label column."}
