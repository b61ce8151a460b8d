"""A folder of images as a TFDS dataset, so it takes the same code path as any catalog dataset.

Layout: `DIR/<class>/...` (the test split held out, seeded and stratified: holdout.py) or
`DIR/train/<class>/...` with an optional `DIR/test/<class>/...`. Every file is opened once, when
the dataset is prepared: what is not a readable JPEG/PNG/BMP/GIF is skipped and listed, images
are stored encoded, and the builder's name carries a fingerprint of the folder, so an unchanged
folder is reused. Why not `tfds.folder_dataset.ImageFolder`: docs/explanation/design-notes.md,
"image_folder.py".
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds

from ampflow.data.images import ENCODED_FORMATS
from ampflow.data.offline_digits import OfflineBuilder
from ampflow.errors import ConfigError, DatasetConfigError

log = logging.getLogger(__name__)

NAME = "ampflow_image_folder"
BUILDER_VERSION = "1.0.0"
SPLIT_DIRS = ("train", "test")
# Split-like folder names beside train/ that ampflow does not read as a split.
OTHER_SPLIT_DIRS = ("val", "valid", "validation", "dev", "eval")
# Pillow's format names → ours (an MPO is a camera JPEG with extra pictures after the first).
_PIL_FORMATS = {"JPEG": "jpeg", "MPO": "jpeg", "PNG": "png", "BMP": "bmp", "GIF": "gif"}
_GRAY_MODES = frozenset({"1", "L", "LA", "I", "F", "I;16", "I;16L", "I;16B", "I;16N"})


@dataclass(frozen=True)
class FolderListing:
    """What the folder holds by name alone (nothing opened): classes, files, fingerprint."""

    root: Path
    layout: str  # "classes" (DIR/<class>) or "splits" (DIR/train/<class>, DIR/test/<class>)
    class_names: tuple[str, ...]
    files: tuple[tuple[str, str, int], ...]  # (path relative to root, split, label)
    stray: tuple[tuple[str, str], ...]  # (path relative to root, reason): not in a class folder
    fingerprint: str

    @property
    def config_name(self) -> str:
        """The TFDS config name: the folder's name (for people) + its fingerprint (for reuse)."""
        slug = re.sub(r"[^a-z0-9]+", "_", self.root.name.lower()).strip("_")[:40] or "folder"
        return f"{slug}_{self.fingerprint[:16]}"


@dataclass(frozen=True)
class ScannedImage:
    """One readable image: where it is, its class and split, and how it is stored."""

    path: str  # relative to the folder
    split: str
    label: int
    height: int
    width: int
    keep_bytes: bool  # stored byte for byte (JPEG/PNG already in the dataset's channels)


@dataclass(frozen=True)
class FolderScan:
    """Every file of a folder opened once: the readable images and the skipped files."""

    listing: FolderListing
    images: tuple[ScannedImage, ...]
    skipped: tuple[dict, ...]  # {"path": ..., "reason": ...}
    channels: int

    @property
    def image_shape(self) -> tuple[int | None, int | None, int]:
        """(H, W, C) when every image has one size, else (None, None, C)."""
        sizes = {(im.height, im.width) for im in self.images}
        if len(sizes) == 1:
            (height, width), = sizes
            return (height, width, self.channels)
        return (None, None, self.channels)


def open_image_folder(root: str | os.PathLike, data_dir: Path):
    """The TFDS builder of `root` in `data_dir`: the prepared one if the folder is unchanged."""
    listing = list_folder(root)
    builder_dir = Path(data_dir) / NAME / listing.config_name / BUILDER_VERSION
    if (builder_dir / "dataset_info.json").is_file():
        log.info("image folder %s unchanged since it was prepared into %s; reusing it",
                 listing.root, builder_dir)
        return tfds.builder_from_directory(os.fspath(builder_dir))
    scan = scan_folder(listing)
    return AmpflowImageFolder(scan=scan, data_dir=os.fspath(data_dir))


def folder_layout(flag: str, root: str | os.PathLike) -> tuple[Path, str, dict[str, Path]]:
    """(the resolved folder, "classes" or "splits", the folder of each split) of `root`.

    The layout rules of a folder of class sub-folders, shared by image_folder and text_folder
    (`flag` names the parameter in the errors): class sub-folders, or train/ and test/ with the
    classes inside; a validation folder beside train/ is refused, not taken for a class.
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ConfigError(
            f"{flag} must be an existing directory of class sub-folders. Received: "
            f"{flag}={str(root)!r} ({'not a directory' if root.exists() else 'missing'})")
    root = root.resolve()
    top = _visible_dirs(root)
    other_splits = sorted(set(top) & set(OTHER_SPLIT_DIRS))
    if "train" in top and other_splits:  # else train/, val/ and test/ would become 3 classes
        raise ConfigError(
            f"{flag} must hold class sub-folders, or train/ and test/ (with the classes "
            f"inside). Received: {str(root)!r} with train/ and {', '.join(other_splits)}/: "
            "rename the validation folder to test/ (ampflow evaluates on test), or move it out")
    layout = "splits" if "train" in top and set(top) <= set(SPLIT_DIRS) else "classes"
    split_roots = ({s: root / s for s in SPLIT_DIRS if s in top} if layout == "splits"
                   else {"train": root})
    return root, layout, split_roots


def list_folder(root: str | os.PathLike) -> FolderListing:
    """Find the classes, the files and the layout of `root`; refuse a folder that has no classes."""
    root, layout, split_roots = folder_layout("image_folder", root)
    class_names = tuple(sorted({c for d in split_roots.values() for c in _visible_dirs(d)}))
    _require_classes(root, class_names)
    labels = {name: i for i, name in enumerate(class_names)}
    files, stray = [], []
    for split, split_root in split_roots.items():
        for path, reason in _loose_files(split_root, class_dirs=set(_visible_dirs(split_root))):
            stray.append((path.relative_to(root).as_posix(), reason))
        for name in _visible_dirs(split_root):
            for path in _walk_files(split_root / name):
                files.append((path.relative_to(root).as_posix(), split, labels[name]))
    if layout == "splits":  # files and folders beside train/ and test/
        stray += [(p.relative_to(root).as_posix(), r)
                  for p, r in _loose_files(root, class_dirs=set(SPLIT_DIRS))]
    return FolderListing(root=root, layout=layout, class_names=class_names, files=tuple(files),
                         stray=tuple(sorted(stray)),
                         fingerprint=_fingerprint(root, [f for f, _, _ in files] +
                                                  [p for p, _ in stray], layout))


def scan_folder(listing: FolderListing) -> FolderScan:
    """Open every file once; keep the readable images, list every other file with its reason."""
    log.info("checking %d files in %s", len(listing.files), listing.root)
    opened, skipped = [], [{"path": p, "reason": r} for p, r in listing.stray]
    for rel, split, label in listing.files:
        result = _inspect(listing.root / rel)
        if isinstance(result, str):
            skipped.append({"path": rel, "reason": result})
        else:
            opened.append((rel, split, label, *result))
    if not opened:
        raise DatasetConfigError(
            f"image_folder must hold at least one readable JPEG/PNG/BMP/GIF image. Received: "
            f"{listing.root} with {len(skipped)} unreadable files "
            f"({describe_skipped(skipped)})")
    channels = 1 if all(row[-1] in _GRAY_MODES for row in opened) else 3  # row[-1]: mode
    images = tuple(_scanned(listing.root, row, channels) for row in opened)
    _require_two_trained_classes(listing, images)
    return FolderScan(listing=listing, images=images,
                      skipped=tuple(sorted(skipped, key=lambda s: s["path"])), channels=channels)


class AmpflowImageFolder(OfflineBuilder, skip_registration=True):
    """The images of one folder (one config per folder content), stored encoded."""

    VERSION = tfds.core.Version(BUILDER_VERSION)
    RELEASE_NOTES = {
        BUILDER_VERSION: "Class sub-folders, optional train/test level, skipped files listed."}

    def __init__(self, *, scan: FolderScan, **kwargs):
        self._scan = scan
        self.SOURCE = f"the image folder {scan.listing.root}"
        config = tfds.core.BuilderConfig(
            name=scan.listing.config_name,
            description=f"The images of {scan.listing.root} (fingerprint "
                        f"{scan.listing.fingerprint}).")
        with _without_absl_warning("Using custom data configuration"):
            super().__init__(config=config, **kwargs)  # one config per folder: not a surprise

    def _info(self) -> tfds.core.DatasetInfo:
        scan = self._scan
        return tfds.core.DatasetInfo(
            builder=self,
            description=f"A folder of images: {scan.listing.root}.",
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=scan.image_shape),
                "label": tfds.features.ClassLabel(names=list(scan.listing.class_names)),
            }),
            supervised_keys=("image", "label"),
            metadata=tfds.core.MetadataDict(
                image_folder=os.fspath(scan.listing.root),
                layout=scan.listing.layout,
                fingerprint=scan.listing.fingerprint,
                skipped_files=list(scan.skipped),
            ),
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        del dl_manager  # nothing to download: the images are on this machine
        splits = sorted({im.split for im in self._scan.images})
        return {split: self._generate_examples(split) for split in splits}

    def _generate_examples(self, split: str):
        from ampflow.progress import track

        root, channels = self._scan.listing.root, self._scan.channels
        images = [im for im in self._scan.images if im.split == split]
        for im in track(images, len(images), f"prepare {split}", unit="example"):
            path = root / im.path
            image = path.read_bytes() if im.keep_bytes else _pil_pixels(path, channels)
            yield im.path, {"image": image, "label": im.label}


@contextlib.contextmanager
def _without_absl_warning(prefix: str):
    """Drop TFDS's log records that start with `prefix` while the block runs."""
    absl_logger = logging.getLogger("absl")

    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(prefix)

    absl_logger.addFilter(keep)
    try:
        yield
    finally:
        absl_logger.removeFilter(keep)


def _visible_dirs(path: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))


def _walk_files(path: Path) -> list[Path]:
    """Every file under `path`, in a stable order (hidden files too: they are listed if bad)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
        dirnames.sort()
        out += [Path(dirpath) / f for f in sorted(filenames)]
    return out


def _loose_files(path: Path, class_dirs: set[str]):
    """Files of `path` that belong to no class: beside the class folders or in hidden ones."""
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.is_dir() and entry.name in class_dirs:
            continue
        if entry.is_dir():
            for f in _walk_files(Path(entry.path)):
                yield f, "in a hidden folder"
        else:
            yield Path(entry.path), "not inside a class folder"


def _fingerprint(root: Path, paths: list[str], layout: str) -> str:
    digest = hashlib.sha256(f"{BUILDER_VERSION}\n{layout}\n".encode())
    for rel in sorted(paths):
        try:
            st = (root / rel).stat()
            digest.update(f"{rel}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
        except OSError:  # a broken link: it will be listed as unreadable
            digest.update(f"{rel}\t-\n".encode())
    return digest.hexdigest()


def _require_classes(root: Path, class_names: tuple[str, ...]) -> None:
    if not class_names:
        raise DatasetConfigError(
            "image_folder must hold one sub-folder per class (optionally under train/ and "
            f"test/). Received: {root} with no class sub-folders")
    if len(class_names) < 2:
        raise DatasetConfigError(
            "image_folder must hold at least 2 class sub-folders (a classifier needs two "
            f"classes). Received: {list(class_names)} in {root}")


def _require_two_trained_classes(listing: FolderListing, images: tuple[ScannedImage, ...]):
    trained = sorted({listing.class_names[im.label] for im in images if im.split == "train"})
    if len(trained) < 2:
        raise DatasetConfigError(
            "image_folder must hold readable training images of at least 2 classes. "
            f"Received: readable training images only in {trained} of "
            f"{list(listing.class_names)} in {listing.root}")
    empty = sorted(set(listing.class_names) - set(trained))
    if empty:
        log.warning("classes with no readable training image (kept as class ids): %s", empty)


def _inspect(path: Path) -> tuple[int, int, str, str] | str:
    """(height, width, format, mode) of a readable image's first frame, or why it is not one."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            fmt = _PIL_FORMATS.get(img.format or "")
            if fmt is None:
                return (f"unsupported format {img.format} (expected one of "
                        f"{', '.join(ENCODED_FORMATS)})")
            img.load()  # decodes the first frame: a truncated or corrupt file fails here
            return img.height, img.width, fmt, img.mode
    except UnidentifiedImageError:
        return "not an image"
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, bomb errors...
        return f"corrupt: {type(e).__name__}: {e}"


def _scanned(root: Path, row: tuple, channels: int) -> ScannedImage:
    rel, split, label, height, width, fmt, mode = row
    native = fmt in ("jpeg", "png") and mode == ("L" if channels == 1 else "RGB")
    keep = native and _tf_decodes(root / rel, channels, (height, width))
    return ScannedImage(path=rel, split=split, label=label, height=height, width=width,
                        keep_bytes=keep)


def _tf_decodes(path: Path, channels: int, size: tuple[int, int]) -> bool:
    """Whether TensorFlow decodes the file to the size Pillow saw (else it is stored as PNG)."""
    import tensorflow as tf

    try:
        image = tf.io.decode_image(path.read_bytes(), channels=channels, expand_animations=False)
    except (tf.errors.OpError, ValueError):
        return False
    return tuple(image.shape) == (*size, channels)


def _pil_pixels(path: Path, channels: int) -> np.ndarray:
    """The first frame as uint8 [H, W, channels]: alpha dropped, gray repeated, 16 bit scaled."""
    from PIL import Image

    with Image.open(path) as img:
        img.load()
        if img.mode.startswith("I") or img.mode == "F":  # 16-bit PNG: scale 0..65535 → 0..255
            gray = np.asarray(img, dtype=np.float64)
            gray = np.clip(np.round(gray / 257.0), 0, 255).astype(np.uint8)[..., None]
            return gray if channels == 1 else np.repeat(gray, 3, axis=-1)
        pixels = np.asarray(img.convert("L" if channels == 1 else "RGB"), dtype=np.uint8)
    return pixels[..., None] if channels == 1 else pixels


def describe_skipped(skipped: list[dict], limit: int = 5) -> str:
    """The first `limit` skipped files and their reasons, on one line."""
    shown = "; ".join(f"{s['path']}: {s['reason']}" for s in skipped[:limit])
    more = len(skipped) - limit
    return shown + (f"; and {more} more" if more > 0 else "")
