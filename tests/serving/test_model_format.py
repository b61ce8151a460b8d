"""The rules of a served model, in one place (`ampflow.serving.model_format`), used by all.

The model name: one rule (TF Serving's REST API addresses `[^/:]+` on the path as sent), and
the export step, the deploy step and the server all apply it, so a name one of them accepts
is never refused by the next. The SavedModel edits: `set_method_name` leaves a fingerprint.pb
that matches the rewritten saved_model.pb, for the fixture model as for an export.
"""

from __future__ import annotations

import urllib.parse

import numpy as np
import pytest

from ampflow.components.deploy_serving import DeployConfig
from ampflow.components.export_savedmodel import ExportConfig
from ampflow.errors import ConfigError, ModelLoadError
from ampflow.serving import model_format
from ampflow.serving.config import ModelConfig

VALID = ["ampflow", "small_cnn", "_private", "digits.v2", "resnet-50", "A1", "x"]
INVALID = ["", ".hidden", "..", "-flag", "a/b", "a:b", "my model", "a+b", "a%20b", "ümlaut",
           "tab\tname", "~home", "a\nb"]


def _export(name, tmp_path):
    return ExportConfig(model_dir=tmp_path, data_dir=tmp_path, export_base=tmp_path,
                        model_name=name, force=True)


def _deploy(name, tmp_path):
    return DeployConfig(saved_model_dir=tmp_path / "m" / "1", model_store=str(tmp_path),
                        model_name=name)


def _serve(name, tmp_path):
    return ModelConfig(name, tmp_path)


@pytest.mark.parametrize("name", VALID)
def test_valid_model_name_is_accepted_by_export_deploy_and_server(name, tmp_path):
    assert model_format.is_model_name(name)
    assert _export(name, tmp_path).model_name == name
    assert _deploy(name, tmp_path).resolved_model_name == name
    assert _serve(name, tmp_path).name == name
    # what makes it TF Serving's rule: every HTTP client sends it as it is, and the REST
    # path pattern of http_rest_api_util.cc finds it
    assert urllib.parse.quote(name, safe="") == name
    assert ":" not in name and "/" not in name


@pytest.mark.parametrize("name", INVALID)
@pytest.mark.parametrize("make", [_export, _deploy, _serve], ids=["export", "deploy", "serve"])
def test_invalid_model_name_is_refused_by_every_step_with_one_message(make, name, tmp_path):
    with pytest.raises(ConfigError, match=r"must be letters, digits, '_', '\.', '-', not "
                                          r"starting with '\.' or '-' .*Received: "):
        make(name, tmp_path)


def test_deploy_checks_the_name_it_takes_from_the_export_layout(tmp_path):
    with pytest.raises(ConfigError, match=r"saved_model_dir's parent dir name must be .*"
                                          r"Received: saved_model_dir's parent dir name='a b'"):
        DeployConfig(saved_model_dir=tmp_path / "a b" / "1", model_store=str(tmp_path))


@pytest.fixture(scope="module")
def fixture_version(tmp_path_factory):
    from ampflow.serving.testing import write_model_version

    return write_model_version(tmp_path_factory.mktemp("base"), 1)


def _fresh_fingerprint(version_dir):
    from tensorflow.core.protobuf import fingerprint_pb2
    from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

    return fingerprint_pb2.FingerprintDef.FromString(
        fingerprinting.CreateFingerprintDef(str(version_dir)))


def test_fixture_model_fingerprint_matches_its_rewritten_saved_model(fixture_version):
    import tensorflow as tf

    stored = tf.saved_model.experimental.read_fingerprint(str(fixture_version))
    fresh = _fresh_fingerprint(fixture_version)
    assert stored.saved_model_checksum == fresh.saved_model_checksum
    assert stored.signature_def_hash == fresh.signature_def_hash
    signatures = model_format.serving_signature_defs(fixture_version)
    assert signatures["classify"].method_name == model_format.CLASSIFY_METHOD
    assert signatures["serving_default"].method_name == model_format.PREDICT_METHOD


def test_warmup_records_round_trip_and_name_the_contract_signatures(tmp_path):
    images = np.arange(2 * 8 * 8, dtype=np.float32).reshape(2, 8, 8, 1)
    assert model_format.write_warmup_records(tmp_path, "m", images, 3) == 4
    logs = model_format.read_warmup_records(tmp_path)
    assert [log.WhichOneof("log_type") for log in logs] == ["predict_log"] * 3 + ["classify_log"]
    assert logs[0].predict_log.request.model_spec.signature_name == "serving_default"
    classify = logs[-1].classify_log.request
    assert classify.model_spec.signature_name == "classify"
    values = classify.input.example_list.examples[0].features.feature["image"].float_list.value
    np.testing.assert_array_equal(np.asarray(values, np.float32), images[0].ravel())
    assert model_format.read_warmup_records(tmp_path / "none") == []


def test_warmup_file_longer_than_tf_serving_allows_is_refused(tmp_path):
    import tensorflow as tf

    path = tmp_path / model_format.WARMUP_FILE
    path.parent.mkdir(parents=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(model_format.MAX_WARMUP_RECORDS + 1):
            writer.write(b"")
    with pytest.raises(ModelLoadError, match=r"at most 1000 warm-up records"):
        model_format.read_warmup_records(tmp_path)


def test_corrupt_saved_model_pb_is_model_load_error_chained_to_the_parse_error(tmp_path):
    from google.protobuf.message import DecodeError

    (tmp_path / "saved_model.pb").write_bytes(b"\xff\x00 not a protobuf")
    with pytest.raises(ModelLoadError, match=r"not a SavedModel protobuf") as info:
        model_format.read_saved_model(tmp_path)
    assert isinstance(info.value.__cause__, DecodeError)


# ---- the one numeric-version rule (issue 23: three scanners, three rules) --------------------
VERSION_NAMES = {"1": 1, "0": 0, "10": 10, "007": 7, str(2**63 - 1): 2**63 - 1}
NOT_VERSIONS = ["²", "1²", "١", "1\n", " 1", "-1", "+1", "1.0", "", ".3.incomplete-x",
                str(2**63), "latest"]


@pytest.mark.parametrize("name,version", VERSION_NAMES.items())
def test_parse_version_name_ascii_digits_are_versions(name, version):
    assert model_format.parse_version_name(name) == version


@pytest.mark.parametrize("name", NOT_VERSIONS)
def test_parse_version_name_anything_else_is_no_version(name):
    assert model_format.parse_version_name(name) is None


def _version_tree(base):
    """Dirs every scanner must read alike: real versions, look-alikes, a file, a duplicate."""
    for name in ("1", "3", "007", "7", "²", "1²", "١", "5\n", ".9.incomplete-x", "latest"):
        (base / name).mkdir(parents=True)
        (base / name / model_format.SAVED_MODEL_PB).write_bytes(b"\x08\x01")
    (base / "8").write_text("a file, not a dir")
    return {1: base / "1", 3: base / "3", 7: base / "7"}


def test_version_dirs_reads_only_numeric_dirs_canonical_name_first(tmp_path):
    expected = _version_tree(tmp_path)
    assert model_format.version_dirs(tmp_path) == expected
    assert model_format.version_dirs(tmp_path / "absent") == {}


def test_every_version_scanner_follows_the_one_rule(tmp_path):
    """The server's poller, export's list/next and convert's resolver: one rule, one answer."""
    from ampflow.artifacts.versions import list_versions, next_version
    from ampflow.components.convert_tflite.step import resolve_saved_model_dir
    from ampflow.serving.models.version_source import discover_versions

    expected = _version_tree(tmp_path)
    assert discover_versions(tmp_path) == expected
    assert list_versions(tmp_path) == sorted(expected)
    assert next_version(tmp_path) == max(expected) + 1
    assert resolve_saved_model_dir(tmp_path) == expected[max(expected)]
