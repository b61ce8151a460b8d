"""The pipeline's comparison with the model serving decides by the rule it is given.

The KFP components themselves (`compare_serving`, then `serving_gate`) on a real served
SavedModel (serving.testing's small one, scored through `serving_default` as a server runs it)
and evaluate's record of the new model's answers (predictions.json), on the first examples of
the digits test split: a new model worse by one example is stopped as "cannot tell", `force`
deploys it and the verdict records it, and the non-inferiority rule decides it by its margin.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from kfp import dsl

from ampflow.components.evaluate_parity import release
from ampflow.components.evaluate_parity.component import compare_serving, serving_gate
from ampflow.components.evaluate_parity.serving_gate import SERVING_VERDICT_FILE
from ampflow.data.split_request import split_request
from ampflow.errors import GateFailedError

CLASSES = tuple(str(i) for i in range(10))  # the digits' class names


@pytest.fixture(scope="module")
def one_worse(prepared_digits, tmp_path_factory):
    """(store, eval dir): the served version, and answers that lose one example it gets right."""
    from ampflow.serving.testing import write_model_version

    store = tmp_path_factory.mktemp("store")
    write_model_version(store / "ampflow", 1, labels=CLASSES, warmup=False)
    full = split_request(prepared_digits, "test")
    served = release.score_served(release.find_served_version(store / "ampflow"), full,
                                  list(CLASSES), 256)
    right = np.nonzero(served.predictions == full.labels)[0]
    assert right.size, "the served model gets no test image right"
    limit = max(18, int(right[0]) + 1)  # a small split holding one example it gets right
    answers = served.predictions[:limit].copy()
    answers[right[0]] = (answers[right[0]] + 1) % len(CLASSES)  # the new model loses it
    eval_dir = tmp_path_factory.mktemp("eval")
    (eval_dir / "predictions.json").write_text(json.dumps(
        {"split": "test", "limit": limit, "labels": full.labels[:limit].tolist(),
         "predictions": answers.tolist()}))
    (eval_dir / "verdict.json").write_text(json.dumps(
        {"passed": True, "failed_checks": [], "model_sha256": "0" * 64}))
    return store, eval_dir


def _compare(prepared_digits, store, eval_dir, out, **rule):
    comparison = dsl.Artifact(uri=str(out / "comparison"))
    metrics = dsl.Metrics(uri=str(out / "metrics"))
    passed, message = compare_serving(
        data=dsl.Dataset(uri=str(prepared_digits)), verdict=dsl.Artifact(uri=str(eval_dir)),
        comparison=comparison, metrics=metrics, serving_model_store=str(store),
        model_name="ampflow", **rule)
    recorded = json.loads((out / "comparison" / SERVING_VERDICT_FILE).read_text())
    return passed, message, comparison, recorded


def test_a_model_one_example_worse_on_a_small_split_is_stopped_unless_forced(
        prepared_digits, one_worse, tmp_path):
    store, eval_dir = one_worse
    passed, message, comparison, recorded = _compare(prepared_digits, store, eval_dir,
                                                     tmp_path / "default")
    assert passed is False and recorded["outcome"] == "cannot tell"
    assert recorded["metrics"]["serving_only_correct"] == 1
    assert recorded["metrics"]["serving_new_only_correct"] == 0
    assert "the paired test detects a drop of" in message and "--force" in message
    with pytest.raises(GateFailedError, match=r"^the model is worse than the one serving on the "
                                              r"point estimate and the test cannot tell"):
        serving_gate(comparison=comparison)

    passed, _, comparison, recorded = _compare(prepared_digits, store, eval_dir,
                                               tmp_path / "forced", force=True)
    assert passed is True and recorded["forced"] is True and recorded["outcome"] == "forced"
    assert comparison.metadata["forced"] is True
    assert recorded["notes"][0].startswith("deployed by force although the test could not tell")
    serving_gate(comparison=comparison)  # deploy may go on


def test_the_non_inferiority_rule_decides_the_same_split_by_its_margin(
        prepared_digits, one_worse, tmp_path):
    store, eval_dir = one_worse
    rule = {"serving_rule": "non-inferiority"}
    passed, _, comparison, recorded = _compare(prepared_digits, store, eval_dir,
                                               tmp_path / "tight", non_inferiority_margin=5.0,
                                               **rule)
    assert passed is False and recorded["outcome"] == "not shown non-inferior"
    with pytest.raises(GateFailedError, match="do not show the model is within the "
                                              "non-inferiority margin"):
        serving_gate(comparison=comparison)
    passed, _, _, recorded = _compare(prepared_digits, store, eval_dir, tmp_path / "loose",
                                      non_inferiority_margin=60.0, **rule)
    assert passed is True and recorded["metrics"]["serving_noninferiority_p_value"] <= 0.01
