"""The release gate against the model serving, on text: the served model is sent raw texts.

A served text model tokenizes in its graph (`serving_default` takes `text`, tf.string [-1]), so
it is scored as a server runs it, on the test split's raw texts, and a new model with another
vocabulary is still compared with it on the same examples. The model serving is the real
bert_tiny export shared by the export, convert and deploy tests (tests/tiny_text_model.py,
made once per test run under a file lock), installed in a tmp store. The worse model is that same
trained model given a reversed vocabulary: each word reads as another word's embedding, so it
answers near chance, and it tokenizes differently from the served model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tiny_text_model import export_text_model

from ampflow.artifacts.verdict import load_verdict
from ampflow.components.evaluate_parity import EvaluateConfig, release, run_evaluate
from ampflow.components.evaluate_parity.serving_gate import ServingGateConfig, run_serving_gate
from ampflow.data.split_request import SplitRequest, split_request
from ampflow.errors import ConfigError, GateFailedError

MODEL = "reviews"


def test_a_served_image_model_is_not_compared_on_a_text_split_in_one_line(tmp_path):
    from ampflow.artifacts.signature_names import TEXT_INPUT
    from ampflow.serving.testing import write_model_version

    labels = ("gloomy", "happy", "weird")
    write_model_version(tmp_path / MODEL, 1, labels=labels, warmup=False)
    served = release.find_served_version(tmp_path / MODEL)
    texts = SplitRequest(TEXT_INPUT, np.array([b"a great film", b"odd"], dtype=object),
                                 np.array([1, 2]))
    with pytest.raises(ConfigError) as refused:
        release.score_served(served, texts, list(labels), 32)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"the model serving at {tmp_path / MODEL / '1'} (version 1) cannot be compared with "
        "this model on the same examples: it takes images [8, 8, 1], this split holds text. ")


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """(data dir, model dir, served base path): the shared text export as version 1 of a store."""
    data_dir, model_dir, version_dir = export_text_model(tmp_path_factory)
    base_path = tmp_path_factory.mktemp("store") / MODEL
    shutil.copytree(version_dir, base_path / "1")
    return data_dir, model_dir, base_path


def _served_class_ids(base_path: Path, data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """The served model's answers to the raw test texts, computed here with TensorFlow itself."""
    import tensorflow as tf

    from ampflow.data import load_texts

    texts, labels = load_texts(data_dir, "test")
    fn = tf.saved_model.load(str(base_path / "1")).signatures["serving_default"]
    return fn(text=tf.constant(texts, tf.string))["class_ids"].numpy(), labels


def _paired(eval_dir: Path, served_ids: np.ndarray, labels: np.ndarray) -> tuple[int, int]:
    """(new only right, served only right) from the evaluation's recorded answers."""
    recorded = json.loads((eval_dir / "predictions.json").read_text())
    assert recorded["labels"] == labels.tolist()
    new_ids = np.array(recorded["predictions"])
    return (int(np.sum((new_ids == labels) & (served_ids != labels))),
            int(np.sum((new_ids != labels) & (served_ids == labels))))


def _reversed_vocabulary(model_dir: Path, into: Path) -> Path:
    """A copy of the model whose vocab.txt lists the words in reverse: other ids, worse answers."""
    shutil.copytree(model_dir, into)
    lines = (into / "vocab.txt").read_text(encoding="utf-8").split("\n")
    words = [line for line in lines[2:] if line]
    (into / "vocab.txt").write_text("\n".join(lines[:2] + words[::-1]) + "\n", encoding="utf-8")
    return into


@pytest.mark.slow  # the shared text model (trained and exported once per session) is scored
def test_a_text_model_is_compared_with_the_served_one_on_the_raw_texts(text_run, tmp_path):
    data_dir, model_dir, base_path = text_run
    served_ids, labels = _served_class_ids(base_path, data_dir)

    # the same model as the one serving: the paired numbers in the verdict, and it passes
    same = run_evaluate(EvaluateConfig(model_dir=model_dir, data_dir=data_dir,
                                       output_dir=tmp_path / "same",
                                       serving_base_path=str(base_path)))
    assert same.passed, same.verdict["message"]
    metrics = same.metrics
    assert (metrics["serving_new_only_correct"], metrics["serving_only_correct"]) == _paired(
        tmp_path / "same", served_ids, labels)
    assert metrics["serving_accuracy"] == pytest.approx(np.mean(served_ids == labels))
    assert metrics["serving_version"] == 1.0 and metrics["num_examples"] == len(labels)
    assert same.verdict["baselines"]["serving"] == {
        "base_path": str(base_path), "version": 1, "path": str(base_path / "1")}
    assert same.verdict["checks"][-1]["name"] == "serving_mcnemar_p_value"

    # a worse model with another vocabulary: the served model tokenizes its own texts, so the
    # two are compared on the same examples, and the worse one is refused with the numbers
    worse_dir = _reversed_vocabulary(model_dir, tmp_path / "worse-model")
    worse = run_evaluate(EvaluateConfig(model_dir=worse_dir, data_dir=data_dir,
                                        output_dir=tmp_path / "worse", fail_on_gate=False,
                                        serving_base_path=str(base_path)))
    new_only, served_only = _paired(tmp_path / "worse", served_ids, labels)
    assert (worse.metrics["serving_new_only_correct"],
            worse.metrics["serving_only_correct"]) == (new_only, served_only)
    assert worse.metrics["serving_accuracy"] == metrics["serving_accuracy"]  # same raw texts
    (failed,) = [c for c in load_verdict(tmp_path / "worse")["failed_checks"]
                 if c["name"] == "serving_mcnemar_p_value"]
    assert failed["reason"].startswith(
        f"accuracy {worse.metrics['amp_accuracy']:.3f} is significantly below the serving "
        f"model's {metrics['serving_accuracy']:.3f} (version 1 at {base_path}): on the same "
        f"{len(labels)} test texts it is right on {new_only} that the serving model gets "
        f"wrong and wrong on {served_only} that it gets right")

    # the pipeline's path: the comparison task reads evaluate's record and sends the raw texts
    with pytest.raises(GateFailedError, match=r"^the model is significantly worse than the one "
                                              r"serving, so it is not deployed: accuracy "):
        run_serving_gate(ServingGateConfig(eval_dir=tmp_path / "worse", data_dir=data_dir,
                                           output_dir=tmp_path / "compare",
                                           serving_base_path=str(base_path)))
    recorded = json.loads((tmp_path / "compare" / "serving_verdict.json").read_text())
    assert recorded["metrics"]["serving_only_correct"] == served_only
    passed = run_serving_gate(ServingGateConfig(eval_dir=tmp_path / "same", data_dir=data_dir,
                                                output_dir=tmp_path / "compare-same",
                                                serving_base_path=str(base_path)))
    assert passed.passed and passed.verdict["metrics"]["serving_only_correct"] == (
        metrics["serving_only_correct"])


@pytest.mark.slow  # evaluate loads the shared text model before it reads the store
def test_a_served_image_model_and_a_text_split_are_one_line_each_way(text_run, tmp_path,
                                                                     prepared_digits):
    from ampflow.serving.testing import write_model_version

    data_dir, model_dir, text_base = text_run
    image_base = tmp_path / "images-store" / MODEL
    write_model_version(image_base, 1, labels=("gloomy", "happy", "weird"), warmup=False)
    with pytest.raises(ConfigError, match=r"^the model serving at \S+ \(version 1\) cannot be "
                                          r"compared with this model on the same examples: it "
                                          r"takes images \[8, 8, 1\], this split holds text\. "
                                          r"[^\n]*$"):
        run_evaluate(EvaluateConfig(model_dir=model_dir, data_dir=data_dir,
                                    output_dir=tmp_path / "eval",
                                    serving_base_path=str(image_base)))
    assert not (tmp_path / "eval").exists()
    # and the other way: a served text model on an image split
    digits = split_request(prepared_digits, "test", limit=4)
    with pytest.raises(ConfigError, match=r"it takes text, this split holds images \[8, 8, 1\]; "
                                          r"it answers 3 classes, this split has 10\. "):
        release.score_served(release.find_served_version(text_base), digits,
                             [str(i) for i in range(10)], 32)
