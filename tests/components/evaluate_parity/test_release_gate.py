"""The release gate with real models: a model at chance stops, one worse than the model serving
is refused with the paired numbers, a better one passes (issue 38).

The model serving is a real exported SavedModel in a TF Serving layout store
(`<store>/ampflow/1`), read by the gate as a server runs it, never retrained. The chance run
is the issue's: a folder of 60 images in 3 classes (pure noise here, so nothing can be
learned), 1 epoch of 1 step, 6 test images.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile

import numpy as np
import pytest
from kfp import dsl

from ampflow.artifacts.verdict import load_verdict
from ampflow.components.evaluate_parity import EvaluateConfig, run_evaluate
from ampflow.components.evaluate_parity.serving_gate import (
    SERVING_VERDICT_FILE,
    ServingGateConfig,
    run_serving_gate,
)
from ampflow.components.export_savedmodel.step import ExportConfig, run_export
from ampflow.data.split_request import SplitRequest
from ampflow.errors import ConfigError, GateFailedError

pytestmark = pytest.mark.slow


def _noise_folder(root, per_class: int = 20, side: int = 8):
    """3 classes of pure-noise PNGs: nothing tells one class from another."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in ("cats", "dogs", "owls"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def serve(tmp_path_factory, prepared_digits):
    """`serve(model_dir)` -> a store's base path serving that model as version 1."""

    def _serve(model_dir, name: str):
        store = tmp_path_factory.mktemp(name)
        run_export(ExportConfig(model_dir=model_dir, data_dir=prepared_digits, export_base=store,
                                force=True, num_warmup_records=1, num_canary_examples=1,
                                num_parity_images=16))
        return store / "ampflow"

    return _serve


def _served_class_ids(base_path, prepared_digits) -> tuple[np.ndarray, np.ndarray]:
    """The served version's answers, computed here with TensorFlow itself."""
    import tensorflow as tf

    from ampflow.data import load_arrays

    images, labels = load_arrays(prepared_digits, "test")
    fn = tf.saved_model.load(str(base_path / "1")).signatures["serving_default"]
    return fn(images=tf.constant(images, tf.float32))["class_ids"].numpy(), labels


def test_a_model_at_chance_on_sixty_images_stops_at_the_gate_in_one_line(tmp_path, caplog):
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data
    from ampflow.components.train import TrainConfig, run_train

    data = run_prepare_data(PrepareDataConfig(
        output_dir=tmp_path / "data", image_folder=_noise_folder(tmp_path / "images"),
        image_size=(8, 8))).output_dir
    with caplog.at_level(logging.WARNING):
        model_dir = run_train(TrainConfig(data_dir=data, output_dir=tmp_path / "model",
                                          epochs=1, batch_size=32)).output_dir
    # said at train start: 54 training images at batch 32 are one step an epoch
    assert "an epoch is 1 step(s) (54 training examples at a global batch of 32)" in caplog.text

    with pytest.raises(GateFailedError) as failed:
        run_evaluate(EvaluateConfig(model_dir=model_dir, data_dir=data,
                                    output_dir=tmp_path / "eval"))
    message = str(failed.value)
    assert "\n" not in message
    assert re.search(r"chance_binomial_p_value: accuracy 0\.\d{3} is not above chance 0\.333 "
                     r"\(the majority-class rate of the 6 test examples, class '\w+'\): "
                     r"one-sided binomial p = \S+ > alpha 0\.01", message), message
    assert re.search(r"note: the test split of 6 images is too small to decide whether the "
                     r"model beats chance: .* needs at least \d+ images for 0\.8; hold out "
                     r"more images \(--test-fraction", message), message
    verdict = load_verdict(tmp_path / "eval")
    assert not verdict["passed"] and "chance_binomial_p_value" in {
        c["name"] for c in verdict["failed_checks"]}
    assert verdict["baselines"]["chance"] == "the majority-class rate of the split"
    assert verdict["baselines"]["serving"] is None
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["chance_accuracy"] == pytest.approx(1 / 3)
    assert metrics["chance_test_power"] < 0.8
    assert "accuracy 0." in (tmp_path / "eval" / "report.md").read_text()
    # nothing is exported
    with pytest.raises(GateFailedError, match="parity gate failed"):
        run_export(ExportConfig(model_dir=model_dir, data_dir=data,
                                export_base=tmp_path / "export", eval_dir=tmp_path / "eval"))
    assert not list((tmp_path / "export").glob("*/*"))


def test_a_model_worse_than_the_one_serving_is_refused_and_a_better_one_passes(
        tmp_path, trained_model, prepared_digits, serve, monkeypatch):
    good, worse = trained_model("mixed_float16"), trained_model("mixed_bfloat16", epochs=1)
    serving_good = serve(good, "serving-good")

    result = run_evaluate(EvaluateConfig(model_dir=worse, data_dir=prepared_digits,
                                         output_dir=tmp_path / "worse", fail_on_gate=False,
                                         serving_base_path=str(serving_good)))
    metrics = result.metrics
    # the paired numbers, recomputed here from the served SavedModel and the worse model's
    # recorded answers
    served_ids, labels = _served_class_ids(serving_good, prepared_digits)
    recorded = json.loads((tmp_path / "worse" / "predictions.json").read_text())
    new_ids = np.array(recorded["predictions"])
    assert recorded["labels"] == labels.tolist()
    new_only = int(np.sum((new_ids == labels) & (served_ids != labels)))
    served_only = int(np.sum((new_ids != labels) & (served_ids == labels)))
    assert (metrics["serving_new_only_correct"], metrics["serving_only_correct"]) == (
        new_only, served_only)
    assert metrics["serving_accuracy"] == pytest.approx(np.mean(served_ids == labels))
    assert metrics["serving_version"] == 1.0 and metrics["serving_mcnemar_p_value"] < 0.01
    assert not result.passed
    (failed,) = [c for c in result.verdict["failed_checks"]
                 if c["name"] == "serving_mcnemar_p_value"]
    assert failed["reason"].startswith(
        f"accuracy {metrics['amp_accuracy']:.3f} is significantly below the serving model's "
        f"{metrics['serving_accuracy']:.3f} (version 1 at {serving_good}): on the same 359 test "
        f"images it is right on {new_only} that the serving model gets wrong and wrong on "
        f"{served_only} that it gets right")
    assert result.verdict["baselines"]["serving"] == {
        "base_path": str(serving_good), "version": 1, "path": str(serving_good / "1")}

    # the pipeline's path: evaluate's record, the comparison task, then its gate
    _compare_in_kfp_tasks(tmp_path, prepared_digits, serving_good, metrics)

    # the same models the other way round: the better model passes, and says by how much;
    # the store named as a URI (gs:// on a cluster) is read with tf.io.gfile through a
    # temporary copy, removed after scoring
    serving_worse = serve(worse, "serving-worse")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    uri = f"file://{serving_worse}"
    better = run_evaluate(EvaluateConfig(model_dir=good, data_dir=prepared_digits,
                                         output_dir=tmp_path / "better", serving_base_path=uri))
    assert better.passed, better.verdict["message"]
    assert better.metrics["serving_accuracy_delta_points"] > 3.0
    assert better.verdict["baselines"]["serving"] == {"base_path": uri, "version": 1,
                                                      "path": f"{uri}/1"}
    assert list((tmp_path / "tmp").iterdir()) == []
    names = [c["name"] for c in better.verdict["checks"]]
    assert names[0] == "chance_binomial_p_value" and names[-1] == "serving_mcnemar_p_value"

    # a served model of another shape is not compared, in one line, before any scoring
    from ampflow.components.evaluate_parity import release

    served = release.find_served_version(serving_worse)
    request = SplitRequest("images", np.zeros((2, 16, 16, 3), np.float32),
                                   np.zeros(2, int))
    with pytest.raises(ConfigError, match=r"cannot be compared with this model on the same "
                                          r"examples: it takes images \[8, 8, 1\], this split "
                                          r"holds images \[16, 16, 3\]"):
        release.score_served(served, request, [str(i) for i in range(10)], 32)


def _compare_in_kfp_tasks(tmp_path, prepared_digits, base_path, inline: dict) -> None:
    """compare_serving publishes the same numbers, serving_gate refuses with them."""
    from ampflow.components.evaluate_parity.component import compare_serving, serving_gate

    comparison = dsl.Artifact(uri=str(tmp_path / "comparison"))
    metrics = dsl.Metrics(uri=str(tmp_path / "comparison-metrics"))
    passed, message = compare_serving(
        data=dsl.Dataset(uri=str(prepared_digits)),
        verdict=dsl.Artifact(uri=str(tmp_path / "worse")), comparison=comparison,
        metrics=metrics, serving_model_store=str(base_path.parent), model_name=base_path.name)
    assert passed is False and "is significantly below the serving model's" in message
    for key in ("serving_new_only_correct", "serving_only_correct", "serving_mcnemar_p_value"):
        assert metrics.metadata[key] == pytest.approx(inline[key]), key
    with pytest.raises(GateFailedError, match=r"^the model is significantly worse than the one "
                                              r"serving, so it is not deployed: accuracy "):
        serving_gate(comparison=comparison)
    # with nothing serving yet, the first release passes and says so
    first = run_serving_gate(ServingGateConfig(
        eval_dir=tmp_path / "worse", data_dir=prepared_digits, output_dir=tmp_path / "first",
        serving_base_path=str(tmp_path / "empty-store" / "ampflow")))
    assert first.passed and first.message == (
        "no model serving to compare with (no version serving there: the first release)")
    assert json.loads((tmp_path / "first" / SERVING_VERDICT_FILE).read_text())["passed"]
