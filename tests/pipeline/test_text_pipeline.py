"""A folder of texts through the whole local pipeline with bert_tiny (issue 39 point 5).

The folder is made here: three classes of short texts (filler words around one keyword of the
class, so bert_tiny learns it from scratch in two short epochs), a test/ folder of 20 a class
(60 texts: the release gate's chance test decides, with no too-small note), and one training
file that is not UTF-8. `run-local --text-folder DIR --model bert_tiny --max-sequence-length
16` prepares, trains under mixed_float16, gates, exports the raw-text SavedModel, converts
the token-id TFLite models (the default variants, full_int8 too) and deploys a version; the
bad file is counted and listed, and the step lines and the results table say the texts, what
was left out and the sequence length.
Then `ampflow serve` serves the deployed version and `ampflow predict --text` answers a raw
sentence over gRPC and REST with the class the trained model gives in process.
"""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

SEQ = 16
KEYWORDS = {"gloomy": ("awful", "dreadful", "dull"), "happy": ("great", "superb", "wonderful"),
            "weird": ("odd", "strange", "surreal")}
FILLER = ("the", "film", "was", "a", "story", "about", "people", "in", "this", "city", "and",
          "its", "cast", "plot", "ending", "really", "quite", "music")
PER_CLASS = {"train": 90, "test": 20}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    rng = np.random.default_rng(7)
    root = tmp_path_factory.mktemp("texts") / "reviews"
    for split, count in PER_CLASS.items():
        for name, keywords in KEYWORDS.items():
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                words = list(rng.choice(FILLER, size=int(rng.integers(4, 10))))
                words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(keywords)))
                (root / split / name / f"{i}.txt").write_text(" ".join(words) + ".",
                                                              encoding="utf-8")
    (root / "train" / "happy" / "latin1.txt").write_bytes("un film très réussi".encode("latin-1"))
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _in_process_class(model_dir: Path, sentence: str) -> str:
    """The class the trained Keras model gives the sentence, through its own tokenizer."""
    from ampflow.artifacts.model_dir import load_trained

    trained = load_trained(model_dir)
    probabilities = trained.model(trained.tokenizer.tokenize([sentence]), training=False)
    return trained.metadata["class_names"][int(np.argmax(probabilities[0]))]


def test_a_text_folder_runs_the_whole_pipeline_with_bert_tiny_and_serves_raw_text(
        tmp_path, folder, capsys):
    from ampflow.pipeline.report import results, results_table
    from ampflow.pipeline.run_local import LocalRunConfig, run_local

    config = LocalRunConfig(
        workdir=tmp_path / "run", text_folder=str(folder), model="bert_tiny",
        max_sequence_length=SEQ, epochs=2, xla="off", with_float32_baseline=False)
    console = io.StringIO()
    result = run_local(config, console=console)  # raises if any step (the gate) failed

    info = json.loads((result.artifacts["prepare-data"]["data"] / "dataset_info.json")
                      .read_text())
    assert info["modality"] == "text" and info["class_names"] == sorted(KEYWORDS)
    assert info["skipped_files"]["by_reason"] == {"not UTF-8": 1}
    assert info["skipped_files"]["files"][0]["path"].endswith("latin1.txt")
    metadata = json.loads((result.artifacts["train"]["model"] / "metadata.json").read_text())
    assert metadata["tokenizer"]["max_sequence_length"] == SEQ
    assert metadata["precision"]["policy"] == "mixed_float16"
    verdict = json.loads((result.artifacts["evaluate-parity"]["verdict"] / "verdict.json")
                         .read_text())
    assert verdict["passed"] and verdict["notes"] == []  # 60 test texts decide against chance
    assert verdict["checks"][0]["name"] == "chance_binomial_p_value"
    # the default variants, full_int8 too, each past its gate (issue 46: it was refused)
    conversion = json.loads((result.artifacts["convert-tflite"]["tflite"] / "report.json")
                            .read_text())
    assert {v: r["passed"] for v, r in conversion["variants"].items()} == dict.fromkeys(
        ("float32", "float16", "dynamic_range", "full_int8"), True)
    endpoint = json.loads(result.artifacts["deploy-serving"]["endpoint"].read_text())
    assert endpoint["version"] == 1
    assert (config.serving_base / "1" / "saved_model.pb").is_file()

    lines = console.getvalue()
    (data_line,) = [line for line in lines.splitlines()
                    if "prepare-data" in line and "done in" in line]
    assert "270 train" in data_line and "60 test" in data_line, data_line
    assert data_line.endswith(" texts; 1 file or row left out (not UTF-8: 1)"), data_line
    assert f"texts/s, sequence length {SEQ}," in lines
    table = results_table(results(result))
    assert "data.skipped" in table and "(not UTF-8: 1)" in table
    assert f"sequence length {SEQ}, " in table and "train.throughput_texts_per_s" in table
    kfp_metrics = (result.run_dir / "train" / "executor_output.json").read_text()  # KFP's UI
    assert "throughput_texts_per_s" in kfp_metrics and "img_per_s" not in kfp_metrics

    sentence = "a superb cast"  # short: predict shows a long text cut
    expected = _in_process_class(result.artifacts["train"]["model"], sentence)
    _served_classes_are(config, sentence, expected, tmp_path, capsys)


def _served_classes_are(config, sentence: str, expected: str, tmp_path: Path, capsys) -> None:
    """`ampflow predict --text` over gRPC and REST says it."""
    from ampflow.cli import main
    from ampflow.serving.client import PredictionClient
    from ampflow.serving.testing import ServeProcess

    rest_port = _free_port()
    with ServeProcess(config.model_name, config.serving_base, tmp_path / "serve.log",
                      "--rest-api-port", str(rest_port)) as server:
        PredictionClient(server.address).wait_until_available(config.model_name, timeout=120)
        args = ["--top-k", "1", "--text", sentence]
        lines = {}
        # through the CLI's main, in this process: a process per call would only pay
        # another TensorFlow start-up (tests/serving covers predict's own process)
        for protocol, port in (("grpc", server.address.rsplit(":", 1)[1]),
                               ("rest", str(rest_port))):
            capsys.readouterr()
            assert main(["predict", "--protocol", protocol, "--port", port, *args]) == 0
            lines[protocol] = capsys.readouterr().out.splitlines()
    for protocol, out in lines.items():
        assert out[0].endswith("signature serving_default"), (protocol, out)
        # `'text': name (id) probability`
        assert out[1].startswith(repr(sentence) + ": "), (protocol, out)
        assert out[1].rsplit(": ", 1)[1].split(" (")[0] == expected, (protocol, out)
