"""Image files for a served model: their bytes as they are, or pixels (.npy, or Pillow)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ampflow_client.errors import ConfigError

# Leading bytes of the formats TensorFlow's DecodeImage tells apart (what `image_bytes` takes).
ENCODED_IMAGE_MAGIC = {"jpeg": b"\xff\xd8\xff", "png": b"\x89PNG\r\n\x1a\n", "gif": b"GIF8",
                       "bmp": b"BM"}


def encoded_image_format(data: bytes) -> str | None:
    """"jpeg"/"png"/"gif"/"bmp" when `data` starts like that format."""
    return next((n for n, magic in ENCODED_IMAGE_MAGIC.items() if data.startswith(magic)), None)


def is_image_file(path: str | Path) -> bool:
    """Whether `path` is a file that starts like a JPEG/PNG/BMP/GIF image."""
    try:
        with open(path, "rb") as f:
            return encoded_image_format(f.read(16)) is not None
    except OSError:
        return False


def read_encoded_images(paths: Sequence[str | Path]) -> list[bytes]:
    """Image files' bytes as they are (told by content, not by name)."""
    files = []
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"input file must be readable. Received: {path} "
                              f"({e.strerror})") from e
        if encoded_image_format(data) is None:
            raise ConfigError(f"input must be an image file ({'/'.join(ENCODED_IMAGE_MAGIC)} by "
                              f"content) to send as encoded bytes. Received: {path}")
        files.append(data)
    return files


def load_images(paths: Sequence[str | Path], shape: tuple[int, ...] | None) -> np.ndarray:
    """Files -> one float32 batch of raw 0..255 pixels: .npy arrays, or images via Pillow.

    `shape` is the signature's input shape ([-1, H, W, C]): pictures are converted to C
    channels and resized to H x W. Pillow is needed only for pictures (`ampflow-client[images]`).
    """
    arrays = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"input file must exist. Received: {path}")
        if path.suffix.lower() == ".npy":
            try:
                array = np.load(path, allow_pickle=False).astype(np.float32)
            except (ValueError, OSError, EOFError) as e:
                raise ConfigError(f"input must be a readable numeric .npy array. Received: "
                                  f"{path} ({e})") from e
            if shape is not None and array.ndim == len(shape) - 1:
                array = array[None]
        else:
            array = _picture(path, shape)[None]
        arrays.append(array)
    shapes = {a.shape[1:] for a in arrays}
    if len(shapes) > 1:
        found = ", ".join(f"{p}: {a.shape[1:]}" for p, a in zip(paths, arrays, strict=True))
        raise ConfigError(f"input files must all hold images of one shape. Received: {found}")
    return np.concatenate(arrays)


def _picture(path: Path, shape) -> np.ndarray:
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as e:
        raise ConfigError("sending a picture as pixels needs Pillow (pip install "
                          "'ampflow-client[images]'), or give a .npy array, or use a signature "
                          f"that takes encoded images. Received: {path}") from e
    try:
        image = Image.open(path)
    except (UnidentifiedImageError, OSError) as e:
        raise ConfigError(f"input must be a PNG/JPEG image or .npy file. Received: {path}") from e
    if shape is not None and len(shape) == 4:
        _, h, w, c = shape
        image = image.convert("L" if c == 1 else "RGB")
        if h > 0 and w > 0:
            image = image.resize((w, h))
    array = np.asarray(image, dtype=np.float32)
    return array[..., None] if array.ndim == 2 else array


def top_k(probabilities: np.ndarray, k: int, labels: Sequence[str] | None = None
          ) -> list[list[tuple[int, str, float]]]:
    """Per row, the k best (class id, label, probability), best first."""
    rows = []
    for row in np.atleast_2d(probabilities):
        best = np.argsort(-row, kind="stable")[:k]
        rows.append([(int(i), labels[i] if labels and i < len(labels) else str(int(i)),
                      float(row[i])) for i in best])
    return rows
