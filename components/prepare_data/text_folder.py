"""`--text-folder`: the layout of `keras.utils.text_dataset_from_directory` (and aclImdb).

    DIR/<class>/*.txt            every text is training data; the test split is held out
                                 (seeded, stratified: holdout.py)
    DIR/train/<class>/*.txt      with an optional DIR/test/<class>/*.txt: the folder's own
                                 split (a DIR whose only sub-folders are train/ and test/)

The class names are the sub-folder names, sorted (Keras's order too); a file in a sub-folder
of a class folder counts as that class. One file is one example, its whole content the text.
Each file is read once, when the dataset is prepared, and left out, with its reason in
dataset_info.json, when it is not a `.txt` file (Keras reads only those), is larger than
`max_text_bytes` (checked on its size, before it is read), is not UTF-8 (a leading BOM is
dropped), or holds nothing but whitespace; so is a file outside any class folder.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ampflow.components.prepare_data.image_folder import (
    SPLIT_DIRS,
    _loose_files,
    _visible_dirs,
    _walk_files,
    folder_layout,
)
from ampflow.components.prepare_data.text_source import (
    SkipLog,
    TextExample,
    TextScan,
    TextSourceKey,
    decode_utf8,
    fingerprint,
    make_builder,
    prepared_builder,
    require_two_classes,
)
from ampflow.data.modality import (
    SKIP_EMPTY,
    SKIP_NOT_TXT,
    SKIP_OUTSIDE,
    SKIP_TOO_LARGE,
    SKIP_UNREADABLE,
)
from ampflow.errors import DatasetConfigError

log = logging.getLogger(__name__)

TEXT_SUFFIX = ".txt"


def open_text_folder(root: str | os.PathLike, data_dir: Path, max_text_bytes: int):
    """The TFDS builder of `root` in `data_dir`: the prepared one if the folder is unchanged."""
    root, layout, split_roots = folder_layout("text_folder", root)
    class_names = tuple(sorted({c for d in split_roots.values() for c in _visible_dirs(d)}))
    if not class_names:
        raise DatasetConfigError(
            "text_folder must hold one sub-folder per class (optionally under train/ and "
            f"test/). Received: {root} with no class sub-folders")
    if len(class_names) < 2:
        raise DatasetConfigError(
            "text_folder must hold at least 2 class sub-folders (a classifier needs two "
            f"classes). Received: {list(class_names)} in {root}")
    files, stray = _files(root, layout, split_roots, class_names)
    key = TextSourceKey("folder", root, fingerprint(
        "folder", root, [root / rel for rel, _, _ in files] + [root / rel for rel in stray],
        {"layout": layout, "max_text_bytes": max_text_bytes}))
    reused = prepared_builder(key, data_dir)
    if reused is not None:
        return reused
    skipped = SkipLog()
    for rel in stray:
        skipped.add(rel, SKIP_OUTSIDE)
    examples = tuple(_read_files(root, files, max_text_bytes, skipped))
    require_two_classes("text_folder", root, class_names, examples, skipped)
    scan = TextScan(key=key, class_names=class_names, examples=examples, skipped=skipped,
                    details={"layout": layout})
    return make_builder(scan, data_dir)


def _files(root: Path, layout: str, split_roots: dict[str, Path], class_names: tuple[str, ...]):
    """([(path relative to root, split, label)], [paths of files outside any class folder])."""
    labels = {name: i for i, name in enumerate(class_names)}
    files, stray = [], []
    for split, split_root in split_roots.items():
        classes = _visible_dirs(split_root)
        stray += [p.relative_to(root).as_posix()
                  for p, _ in _loose_files(split_root, class_dirs=set(classes))]
        for name in classes:
            files += [(p.relative_to(root).as_posix(), split, labels[name])
                      for p in _walk_files(split_root / name)]
    if layout == "splits":  # files and folders beside train/ and test/ (aclImdb's README...)
        stray += [p.relative_to(root).as_posix()
                  for p, _ in _loose_files(root, class_dirs=set(SPLIT_DIRS))]
    return files, sorted(stray)


def _read_files(root: Path, files, max_text_bytes: int, skipped: SkipLog):
    """Yield the kept examples; count and list every other file with its reason."""
    log.info("reading %d files in %s", len(files), root)
    for rel, split, label in files:
        path = root / rel
        if path.suffix.lower() != TEXT_SUFFIX:
            skipped.add(rel, SKIP_NOT_TXT)
            continue
        text = _read_text(path, max_text_bytes)
        if isinstance(text, tuple):
            skipped.add(rel, *text)
        else:
            yield TextExample(key=rel, split=split, label=label, text=text)


def _read_text(path: Path, max_text_bytes: int) -> str | tuple[str, str]:
    """The file's text, or (reason, detail) when it is left out. Never reads a large file."""
    try:
        size = path.stat().st_size
        if size > max_text_bytes:
            return SKIP_TOO_LARGE, f"{size} bytes > {max_text_bytes}"
        with open(path, "rb") as f:
            data = f.read(max_text_bytes + 1)  # the size may have grown since the stat
    except OSError as e:
        return SKIP_UNREADABLE, str(e.strerror or e)
    if len(data) > max_text_bytes:
        return SKIP_TOO_LARGE, f"more than {max_text_bytes} bytes"
    text = decode_utf8(data)
    if isinstance(text, tuple):
        return text
    if not text.strip():
        return SKIP_EMPTY, ""
    return text
