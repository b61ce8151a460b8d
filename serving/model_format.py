"""What a served model is: TF Serving's rules, in one place for whoever writes or reads one.

The export step writes a model version, the deploy step checks and copies it, the server and
the client read it; they all follow these rules, so the rules live here and nowhere else:
- the model name (`check_model_name`): what TF Serving can serve under both of its APIs;
- the SignatureDef method names TF Serving's Predict and Classify APIs insist on, and
  `set_method_name`, which rewrites one in `saved_model.pb` (TF2 writes every signature as
  Predict) and refreshes `fingerprint.pb`, whose checksum covers `saved_model.pb`;
- the warm-up file TF Serving replays before a version serves (`write_warmup_records`,
  `read_warmup_records`);
- the classify signature's input of docs/ARTIFACTS.md: a tf.Example whose float_list feature
  `image` holds the raw pixels (`image_example`);
- the encoded-image signature of docs/ARTIFACTS.md: its key and input name, the formats it
  decodes (`encoded_image_format`, by content as TensorFlow's `DecodeImage` tells them apart) and
  the largest image it decodes (`MAX_IMAGE_PIXELS`).

Nothing here imports TensorFlow at module level: the CLI and config validation use it too.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import numpy as np

from ampflow.errors import ConfigError, ModelLoadError

log = logging.getLogger(__name__)

# ---- the model name -----------------------------------------------------------------------
# TF Serving's gRPC API takes any non-empty name, but its REST API finds the name in the
# request path with `/v1/models/([^/:]+)` on the path as sent, never percent-decoded
# (http_rest_api_util.cc, net_http's evhttp_request.cc). So a name that needs
# percent-encoding (a space, '+', '%', non-ASCII), or holds '/' or ':', can be configured but
# never reached over REST. What every HTTP client sends unchanged are RFC 3986's unreserved
# characters; of those we keep letters, digits, '_', '.' and '-' ('~' at the start of a path
# is a home directory to a shell), and refuse a leading '.' or '-': the name is also a
# directory (`<export_base>/<name>/`, `<model_store>/<name>/`), and servers skip hidden
# (staging) dirs, while `-x` reads as a flag on a command line.
MODEL_NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
MODEL_NAME_RULE = "letters, digits, '_', '.', '-', not starting with '.' or '-'"
# The served model name (TF Serving's --model_name) every command and the pipeline default to:
# export writes <export_base>/ampflow/<version>/, serve/predict/deploy and k8s/ serve "ampflow".
DEFAULT_MODEL_NAME = "ampflow"


def is_model_name(name: object) -> bool:
    """Whether `name` is a model name TF Serving can serve over gRPC and REST alike."""
    return isinstance(name, str) and MODEL_NAME_PATTERN.fullmatch(name) is not None


def check_model_name(name: object, what: str = "model_name") -> str:
    """`name` itself if it is a valid model name (see `is_model_name`); else ConfigError."""
    if not is_model_name(name):
        raise ConfigError(f"{what} must be {MODEL_NAME_RULE} (a name TF Serving's REST API "
                          f"can address). Received: {what}={name!r}")
    return name


# ---- version dirs --------------------------------------------------------------------------
# A version is a child dir of the model's base path whose name is a number: TF Serving parses
# it with strings::safe_strto64 (ASCII digits, an int64). Python's str.isdigit() also accepts
# '²' or '١' (and int('²') raises); a `$` regex also accepts a trailing newline. So the rule
# is written once, here: ASCII digits only, the whole name, a non-negative int64.
_VERSION_NAME = re.compile(r"[0-9]+")
MAX_VERSION = 2**63 - 1


def parse_version_name(name: str) -> int | None:
    """The version number a dir called `name` stands for, or None when it is no version.

    Staging dirs (`.3.incomplete-x`), '²', '1²', '-1', a name ending in a newline and numbers
    past int64 are None; '0' is version 0, as for TF Serving.
    """
    if not _VERSION_NAME.fullmatch(name):
        return None
    version = int(name)
    return version if version <= MAX_VERSION else None


def version_dirs(base_path: str | os.PathLike) -> dict[int, Path]:
    """Every numeric child dir of `base_path` by its version ({} when it cannot be read).

    Of two names for one number ('7' and '007') the canonical one wins.
    """
    try:
        entries = list(os.scandir(base_path))
    except OSError:
        return {}
    found: dict[int, Path] = {}
    for entry in sorted(entries, key=lambda e: e.name, reverse=True):  # '7' sorts after '007'
        version = parse_version_name(entry.name)
        if version is not None and entry.is_dir():
            found.setdefault(version, Path(entry.path))
    return found


# ---- signatures ---------------------------------------------------------------------------

DEFAULT_SIGNATURE = "serving_default"  # the key TF Serving uses when a request names none
CLASSIFY_SIGNATURE = "classify"  # docs/ARTIFACTS.md's classify signature
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
IMAGE_FEATURE = "image"  # the float_list feature the classify signature parses
IMAGES_INPUT = "images"  # serving_default's input: float32 [-1, H, W, C] raw pixels 0..255
PROBABILITIES_OUTPUT = "probabilities"  # float32 [-1, K], of serving_default and image_bytes
CLASS_IDS_OUTPUT = "class_ids"  # int64 [-1], of serving_default and image_bytes
# The encoded-image signature: one JPEG/PNG/BMP/GIF file's bytes per element of a string [-1]
# input, decoded and resized in the graph as training did; the same outputs as serving_default.
IMAGE_BYTES_SIGNATURE = "image_bytes"
IMAGE_BYTES_INPUT = "image_bytes"
# The largest image (height x width as its header declares it; for a GIF, its canvas) that the
# image_bytes signature decodes. 4096 x 4096 holds a 12 MP phone photo (4032 x 3024); one image
# at the bound decodes to at most 64 MiB of uint8 and 192 MiB as float32 RGB. TensorFlow's own
# decoders allow up to 2**29..2**31 bytes: a 400 KB PNG of 20000 x 20000 zeros decodes to
# 400 MB (measured), so the signature checks the header before it decodes.
MAX_IMAGE_PIXELS = 4096 * 4096
# Leading bytes of each format, as TensorFlow's DecodeImage tells them apart (decode_image_op.cc).
ENCODED_IMAGE_MAGIC = {"jpeg": b"\xff\xd8\xff", "png": b"\x89PNG\r\n\x1a\n", "gif": b"GIF8",
                       "bmp": b"BM"}
SAVED_MODEL_PB = "saved_model.pb"
FINGERPRINT_PB = "fingerprint.pb"
SERVE_TAG = "serve"  # the MetaGraph TF Serving loads
# TensorFlow's SignatureDef of a SavedModel's init op: listed in metadata, never run
INIT_OP_SIGNATURE = "__saved_model_init_op"
# --model-format: what a version dir holds (auto: saved_model.pb, else one .tflite file;
# prefer_tflite: its .tflite file when it has one, else its SavedModel, as TF Serving's
# --prefer_tflite_model)
MODEL_FORMATS = ("auto", "saved_model", "tflite", "prefer_tflite")


def encoded_image_format(data: bytes) -> str | None:
    """"jpeg"/"png"/"gif"/"bmp" when `data` starts like that format (what image_bytes takes)."""
    return next((name for name, magic in ENCODED_IMAGE_MAGIC.items() if data.startswith(magic)),
                None)


def read_saved_model(version_dir: str | os.PathLike, message_type=None):
    """Parse `<version_dir>/saved_model.pb` into a `SavedModel` proto (ModelLoadError if not).

    The error is chained to the cause (FileNotFoundError, protobuf's DecodeError), which the
    server turns into TF Serving's status code. `message_type`: TensorFlow's `SavedModel`
    unless a caller that must not import TensorFlow brings an equal message (deploy does).
    """
    if message_type is None:
        from tensorflow.core.protobuf import saved_model_pb2

        message_type = saved_model_pb2.SavedModel
    path = Path(version_dir) / SAVED_MODEL_PB
    saved_model = message_type()
    try:
        saved_model.ParseFromString(path.read_bytes())
    except OSError as e:
        raise ModelLoadError(f"{path} cannot be read: {e.strerror}") from e
    except Exception as e:  # protobuf raises DecodeError, an internal type
        raise ModelLoadError(f"{path} is not a SavedModel protobuf (corrupt?): {e}") from e
    return saved_model


def serving_meta_graph(saved_model, where: str | os.PathLike):
    """The MetaGraph tagged `serve` of a `SavedModel` proto (what TF Serving loads)."""
    for meta_graph in saved_model.meta_graphs:
        if SERVE_TAG in meta_graph.meta_info_def.tags:
            return meta_graph
    raise ModelLoadError(f"{where} must have a '{SERVE_TAG}' graph (what TF Serving loads). "
                         "Received: no MetaGraph tagged 'serve'")


def serving_signature_defs(version_dir: str | os.PathLike) -> dict:
    """Signature name → SignatureDef proto of the `serve` graph, read from saved_model.pb."""
    saved_model = read_saved_model(version_dir)
    return dict(serving_meta_graph(saved_model, Path(version_dir) / SAVED_MODEL_PB)
                .signature_def)


def set_method_name(version_dir: str | os.PathLike, signature: str, method_name: str) -> None:
    """Rewrite one SignatureDef's method_name in saved_model.pb, then refresh fingerprint.pb.

    TF2's `tf.saved_model.save` writes every SignatureDef with `tensorflow/serving/predict`,
    and TF Serving's Classify API refuses anything but `tensorflow/serving/classify`. Only that
    one string field changes (graph and functions untouched); both files are replaced with a
    rename, so a reader sees the old file or the new one, never half of one.
    """
    version_dir = Path(version_dir)
    saved_model = read_saved_model(version_dir)
    for meta_graph in saved_model.meta_graphs:
        if signature not in meta_graph.signature_def:
            raise ModelLoadError(f"signature {signature!r} must be in {version_dir}. Received: "
                                 f"{sorted(meta_graph.signature_def)}")
        meta_graph.signature_def[signature].method_name = method_name
    _replace(version_dir / SAVED_MODEL_PB, saved_model.SerializeToString(deterministic=True))
    _refresh_fingerprint(version_dir)


def _refresh_fingerprint(version_dir: Path) -> None:
    """Recompute fingerprint.pb after editing saved_model.pb (its checksum would be stale)."""
    path = version_dir / FINGERPRINT_PB
    try:
        from tensorflow.python.saved_model.pywrap_saved_model import (
            fingerprinting as fingerprinting_pywrap,
        )

        serialized = fingerprinting_pywrap.CreateFingerprintDef(str(version_dir))
    except Exception as e:  # a TF without the (private) API: no fingerprint beats a wrong one
        log.warning("could not recompute %s (%s); removing it (it is optional)", path, e)
        path.unlink(missing_ok=True)
        return
    _replace(path, serialized)


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def image_example(image: np.ndarray, feature: str = IMAGE_FEATURE):
    """A tf.Example with one float_list feature: what the contract's classify signature parses."""
    import tensorflow as tf

    values = np.asarray(image, dtype=np.float32).ravel().tolist()
    return tf.train.Example(features=tf.train.Features(feature={
        feature: tf.train.Feature(float_list=tf.train.FloatList(value=values))}))


# ---- warm-up ------------------------------------------------------------------------------

WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
MAX_WARMUP_RECORDS = 1000  # TF Serving's limit


def read_warmup_records(version_dir: str | os.PathLike) -> list:
    """The `PredictionLog` protos of a version's warm-up file ([] if it has none).

    At most MAX_WARMUP_RECORDS are read (one more is looked for, to refuse a longer file as
    TF Serving does: ModelLoadError). A record that does not parse raises protobuf's
    DecodeError, a damaged file TensorFlow's DataLossError: a version with either must not
    serve.
    """
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = Path(version_dir) / WARMUP_FILE
    if not path.is_file():
        return []
    records = [record.numpy() for record in
               tf.data.TFRecordDataset(str(path)).take(MAX_WARMUP_RECORDS + 1)]
    if len(records) > MAX_WARMUP_RECORDS:
        raise ModelLoadError(f"{path} must hold at most {MAX_WARMUP_RECORDS} warm-up records "
                             f"(TF Serving's limit). Received: more")
    return [prediction_log_pb2.PredictionLog.FromString(record) for record in records]


def write_warmup_records(version_dir: str | os.PathLike, model_name: str, images: np.ndarray,
                         num_predict: int, encoded_image: bytes | None = None) -> int:
    """Write `num_predict` Predict requests (one image each, cycling) and one Classify request.

    The requests use docs/ARTIFACTS.md's signatures: `serving_default` on `images`, then, when
    `encoded_image` (one encoded file) is given, one `image_bytes` request on it, and `classify`
    on an `image_example`. Returns the number of records written; with `num_predict == 0` no
    file is written.
    """
    extra = 1 + (encoded_image is not None)
    if not 0 <= num_predict <= MAX_WARMUP_RECORDS - extra:
        raise ConfigError(f"num_predict must be in [0, {MAX_WARMUP_RECORDS - extra}] ({extra} "
                          f"more record(s): Classify, image_bytes). Received: "
                          f"num_predict={num_predict}")
    if num_predict == 0:
        return 0
    if len(images) == 0:
        raise ConfigError("warm-up records need at least one real image. Received: 0 images")
    records = [predict_log(model_name, DEFAULT_SIGNATURE, IMAGES_INPUT,
                           images[i % len(images)][None].astype(np.float32))
               for i in range(num_predict)]
    if encoded_image is not None:
        records.append(predict_log(model_name, IMAGE_BYTES_SIGNATURE, IMAGE_BYTES_INPUT,
                                   np.array([encoded_image], dtype=object)))
    records.append(classify_log(model_name, [image_example(image) for image in images[:1]]))
    return write_warmup_file(version_dir, records)


def write_warmup_file(version_dir: str | os.PathLike, records: list) -> int:
    """Write `records` (PredictionLogs) as the version's WARMUP_FILE; return how many.

    The one writer of the file for every modality: the image records above, the text export's.
    """
    import tensorflow as tf

    path = Path(version_dir) / WARMUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record.SerializeToString())
    return len(records)


def predict_log(model_name: str, signature: str, input_name: str, batch: np.ndarray):
    """A warm-up PredictionLog: one Predict request of `batch` on `signature`'s `input_name`."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature
    request.inputs[input_name].CopyFrom(tf.make_tensor_proto(batch))
    return prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request))


def classify_log(model_name: str, examples: list):
    """A warm-up PredictionLog: one Classify request of `examples` (tf.Examples)."""
    from tensorflow_serving.apis import classification_pb2, prediction_log_pb2

    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = CLASSIFY_SIGNATURE
    request.input.example_list.examples.extend(examples)
    return prediction_log_pb2.PredictionLog(
        classify_log=prediction_log_pb2.ClassifyLog(request=request))
