"""`deploy --serving-format tflite`: a checked TFLite variant published as the served version.

The variants are the real convert step's output (`run_convert`) for the tiny SavedModel of
deploy_helpers.py, calibrated on the offline digits (8x8x1, as that model takes): full_int8
passes its gate, and float16 is made to fail its own (max_prob_diff 0), so the report says so,
as a real failed gate would. As export does, the recorded canary examples are real test images
of the dataset the variant was calibrated on (deploy_helpers' uniform noise lies outside the
int8 ranges calibrated on digits, and full_int8 rightly disagrees with the SavedModel on some).
A real `ampflow serve` polls the store (every version served), and the canary talks to it over
gRPC on loopback.
"""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from deploy_helpers import MODEL_NAME, write_saved_model

from ampflow.components.deploy_serving import DeployConfig, run_deploy
from ampflow.errors import ConfigError, DeployError, GateFailedError
from ampflow.serving.testing import ServeProcess

pytestmark = [pytest.mark.timeout(180)]

TFLITE_FILES = {"full_int8.tflite", "full_int8.json", "ampflow_deploy.json"}


@pytest.fixture(scope="module")
def export_base(prepared_digits, tmp_path_factory):
    """<export_base>/digits/{1,2}/ as in conftest.py, recording 32 real digits test images."""
    import tensorflow as tf

    from ampflow.artifacts.canary_examples import write_canary_examples
    from ampflow.data import load_arrays

    images = load_arrays(prepared_digits, "test")[0][:32]
    base = tmp_path_factory.mktemp("export")
    for version in (1, 2):
        path = write_saved_model(base / MODEL_NAME / str(version), seed=version)
        write_canary_examples(path, tf.saved_model.load(str(path)), images)
    return base


@pytest.fixture(scope="module")
def converted(prepared_digits, export_base, tmp_path_factory):
    """The convert output of digits/1: full_int8 passed, float16 failed its gate."""
    from ampflow.components.convert_tflite import ConvertConfig, run_convert

    out = tmp_path_factory.mktemp("convert") / "tflite"
    with pytest.raises(GateFailedError, match="float16: max_abs_prob_diff"):
        run_convert(ConvertConfig(
            saved_model_dir=export_base / MODEL_NAME / "1", data_dir=prepared_digits,
            output_dir=out, variants=("float16", "full_int8"), representative_size=32,
            test_limit=64, latency_runs=1, warmup_runs=0, float16_max_prob_diff=0.0))
    report = json.loads((out / "report.json").read_text())
    assert {v: r["passed"] for v, r in report["variants"].items()} == {
        "float16": False, "full_int8": True}
    return out


def _tflite(export_base, store, tflite_dir, variant="full_int8", saved_version=1, **kwargs):
    return DeployConfig(saved_model_dir=export_base / MODEL_NAME / str(saved_version),
                        model_store=str(store), serving_format="tflite", tflite_dir=tflite_dir,
                        tflite_variant=variant, **kwargs)


def _published(store) -> list[str]:
    """Every entry under the model's base path but the claim lock: versions and claims."""
    base = store / MODEL_NAME
    return sorted(p.name for p in base.iterdir() if p.name != ".versions.lock") \
        if base.exists() else []


def _variant_answers(path, images):
    """The converter's own runner (not the deploy step's servable), in LiteRT."""
    from ampflow.components.convert_tflite.checks import TFLiteRunner

    return TFLiteRunner(path, runtime="litert").predict(images, batch_size=len(images))


@pytest.fixture(scope="module")
def server(tmp_path_factory, export_base):
    """`ampflow serve` (auto format, every version) on a store holding the SavedModel as 1."""
    root = tmp_path_factory.mktemp("served")
    store = root / "store"
    run_deploy(DeployConfig(saved_model_dir=export_base / MODEL_NAME / "1",
                            model_store=str(store)))
    with ServeProcess(MODEL_NAME, store / MODEL_NAME, root / "server.log",
                      "--file-system-poll-wait-seconds", "0.5",
                      "--version-policy", "all") as running:
        yield store, running.address


@pytest.mark.slow
@pytest.mark.serving
def test_deploy_tflite_full_int8_to_running_server_passes_canary_and_serves_variant(
        server, export_base, converted):
    from ampflow.artifacts.canary_examples import (
        CanaryExamples,
        load_canary_examples,
    )
    from ampflow.components.deploy_serving import canary, model_store

    store, address = server
    result = run_deploy(_tflite(export_base, store, converted, version=2, server_address=address,
                                canary_timeout_s=60, canary_atol=1e-6))
    assert (result.served_version, result.already_present) == (2, False)
    assert result.summary()["tflite_variant"] == "full_int8"
    version_dir = store / MODEL_NAME / "2"
    assert {p.name for p in version_dir.iterdir()} == TFLITE_FILES
    assert (version_dir / "full_int8.tflite").read_bytes() == (
        converted / "full_int8.tflite").read_bytes()
    # the server answers what the converter's own LiteRT runner answers, not the SavedModel
    recorded = load_canary_examples(export_base / MODEL_NAME / "1")
    expected = _variant_answers(version_dir / "full_int8.tflite", recorded.images)
    spec = model_store.check_saved_model(export_base / MODEL_NAME / "1")
    assert canary.check_version_served(
        address, MODEL_NAME, 2, spec, CanaryExamples(recorded.images, *expected.values()),
        timeout_s=30, atol=1e-6) == 2
    assert not np.array_equal(expected["probabilities"], recorded.probabilities)
    assert _published(store) == ["1", "2"]  # the claim is gone


@pytest.mark.slow
@pytest.mark.serving
def test_deploy_tflite_server_answering_another_model_fails_canary_and_unpublishes(
        server, export_base, converted, tmp_path):
    served_store, address = server
    # the server's version 3 is another model (digits/2's weights) ...
    run_deploy(DeployConfig(saved_model_dir=export_base / MODEL_NAME / "2", version=3,
                            model_store=str(served_store)))
    other_store = tmp_path / "store"  # ... while the deploy publishes its version 3 elsewhere
    with pytest.raises(DeployError, match="is not serving this version's model"):
        run_deploy(_tflite(export_base, other_store, converted, version=3,
                           server_address=address, canary_timeout_s=60))
    assert _published(other_store) == []


def test_deploy_tflite_unknown_variant_refused_nothing_published(export_base, converted,
                                                                 tmp_path):
    with pytest.raises(ConfigError, match=r"the convert step produced .*\(float16, full_int8\)"
                                          r"\. Received: tflite_variant='dynamic_range'"):
        run_deploy(_tflite(export_base, tmp_path / "store", converted, "dynamic_range"))
    assert _published(tmp_path / "store") == []


def test_deploy_tflite_failed_variant_refused_nothing_published(export_base, converted,
                                                                tmp_path):
    with pytest.raises(ConfigError, match=r"'float16' failed the convert step's gate "
                                          r"\(max_abs_prob_diff = .* \(must be <= 0\)"):
        run_deploy(_tflite(export_base, tmp_path / "store", converted, "float16"))
    assert _published(tmp_path / "store") == []


@pytest.mark.parametrize("sha_updated", [False, True], ids=["sha-mismatch", "does-not-load"])
def test_deploy_tflite_damaged_file_refused_nothing_published(export_base, converted, tmp_path,
                                                              sha_updated):
    import hashlib

    damaged = tmp_path / "tflite"
    shutil.copytree(converted, damaged)
    path = damaged / "full_int8.tflite"
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])  # truncated
    if sha_updated:  # the metadata rewritten to match: the file itself must still load
        meta = json.loads((damaged / "full_int8.json").read_text())
        meta["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        (damaged / "full_int8.json").write_text(json.dumps(meta))
    why = "does not load" if sha_updated else "is not the file the convert step checked"
    with pytest.raises(ConfigError, match=why):
        run_deploy(_tflite(export_base, tmp_path / "store", damaged))
    assert _published(tmp_path / "store") == []


def test_deploy_tflite_of_another_saved_model_refused_by_its_own_gate(export_base, converted,
                                                                      tmp_path):
    # converted from digits/1, deployed as if it were digits/2: its answers to digits/2's
    # recorded examples break the variant's own agreement threshold (0.97)
    with pytest.raises(ConfigError, match=r"within its own convert gate .*: agreement = .*"
                                          r"the gate's bound: >= 0\.97"):
        run_deploy(_tflite(export_base, tmp_path / "store", converted, saved_version=2))
    assert _published(tmp_path / "store") == []


def _examples(probabilities):
    from ampflow.artifacts.canary_examples import CanaryExamples

    probabilities = np.asarray(probabilities, dtype=np.float32)
    return CanaryExamples(np.zeros((len(probabilities), 8, 8, 1), np.float32), probabilities,
                          np.argmax(probabilities, axis=1))


@pytest.mark.parametrize("flipped_gap, passes", [(0.009, True), (0.2, False)],
                         ids=["near-tie-flip-excused", "clear-flip-refused"])
def test_full_int8_agreement_on_32_examples_excuses_only_near_ties(flipped_gap, passes):
    """The demo model's case: 31 of 32 agree (0.969 < 0.97), the flip a 0.009 near tie, the
    converter's measured max |dp| 0.023. Counting every example refused this correct variant."""
    from ampflow.components.deploy_serving.tflite_variant import (
        TFLiteVariant,
        check_against_saved_model,
    )

    recorded = [[0.9, 0.1]] * 31 + [[0.5 + flipped_gap / 2, 0.5 - flipped_gap / 2]]
    answers = [[0.89, 0.11]] * 31 + [[0.45, 0.55]]
    variant = TFLiteVariant("full_int8", Path("full_int8.tflite"), Path("full_int8.json"),
                            ({"name": "agreement", "op": ">=", "threshold": 0.97},
                             {"name": "accuracy_drop_points", "op": "<=", "threshold": 1.0}),
                            measured_max_prob_diff=0.023)
    if passes:
        check_against_saved_model(_examples(answers), _examples(recorded), variant)
    else:
        with pytest.raises(ConfigError, match=r"agreement = 0\.96875"):
            check_against_saved_model(_examples(answers), _examples(recorded), variant)


def test_deploy_tflite_cli_unknown_variant_one_line_exit_2(export_base, converted, tmp_path,
                                                           capsys):
    from ampflow.cli import main

    code = main(["deploy", "--saved-model-dir", str(export_base / MODEL_NAME / "1"),
                 "--model-store", str(tmp_path / "store"), "--serving-format", "tflite",
                 "--tflite-dir", str(converted), "--tflite-variant", "float32"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--tflite-variant" in err, err
    assert _published(tmp_path / "store") == []


@pytest.mark.parametrize("changes, message", [
    ({"target": "kubernetes", "model_store": "/models"}, "tensorflow_model_server"),
    ({"tflite_dir": None}, "needs tflite_dir"),
    ({"tflite_variant": "int4"}, "tflite_variant must be one of"),
])
def test_deploy_tflite_config_refused(export_base, tmp_path, changes, message):
    args = {"saved_model_dir": export_base / MODEL_NAME / "1", "serving_format": "tflite",
            "model_store": str(tmp_path), "tflite_dir": tmp_path, **changes}
    with pytest.raises(ConfigError, match=message):
        DeployConfig(**args)


@pytest.mark.k8s
def test_deploy_tflite_kserve_publishes_variant_with_model_format_tflite(export_base, converted,
                                                                         tmp_path):
    from fake_apiserver import FakeApiServer

    with FakeApiServer(kserve=True) as api:
        api.kubeconfig(tmp_path / "kubeconfig")
        result = run_deploy(_tflite(export_base, tmp_path / "store", converted, target="kserve",
                                    kubeconfig=tmp_path / "kubeconfig", namespace="team-a"))
        isvc = api.patches[-1]["body"]
    assert result.tflite_variant == "full_int8"
    assert isvc["spec"]["predictor"]["model"]["modelFormat"] == {"name": "tflite",
                                                                 "version": "1"}
    assert {p.name for p in (tmp_path / "store" / MODEL_NAME / "1").iterdir()} == TFLITE_FILES


def test_component_defaults_are_the_deploy_config_defaults():
    from ampflow.components.deploy_serving.component import deploy_serving

    params = inspect.signature(deploy_serving).parameters
    for name in ("serving_format", "tflite_variant"):
        assert params[name].default == DeployConfig.__dataclass_fields__[name].default
