"""A folder of texts through the whole local pipeline with bert_tiny (issue 39 point 5).

The folder is made here: three classes of short texts (filler words around one keyword of the
class, so bert_tiny learns it from scratch in two short epochs), a test/ folder of 20 a class
(60 texts: the release gate's chance test decides, with no too-small note), and one training
file that is not UTF-8. `run-local --text-folder DIR --model bert_tiny --max-sequence-length
16` prepares, trains under mixed_float16, gates, exports the raw-text SavedModel, converts
the token-id float32 TFLite model (every default variant of a text model, full_int8 too, is
converted and gated by tests/test_cli_step_by_step.py's `ampflow convert`: the four took 44 s
here at load 9) and deploys a version; the bad file is counted and listed, and the
step lines and the results table say the texts, what was left out and the sequence length.
Then `ampflow serve` serves the deployed version (in this process, as typed: a server process
only paid another TensorFlow start-up) and `ampflow predict --wait-s 60 --text` answers a raw
sentence over gRPC and REST with the class the trained model gives in process: the suite's one
walk of those two commands on a text model (tests/test_cli_step_by_step.py's text walk stops
at deploy).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from ports import free_port

# a hang guard, not a speed bound: the run took 566-600 s here at load 20 (77 s quiet)
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

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


def _free_ports() -> tuple[int, int]:
    """Two loopback ports for servers, each handed out once (tests/ports.py says why)."""
    return free_port(), free_port()


def _in_process_class(model_dir: Path, sentence: str) -> str:
    """The class the trained Keras model gives the sentence, through its own tokenizer."""
    from ampflow.artifacts.model_dir import load_trained

    trained = load_trained(model_dir)
    probabilities = trained.model(trained.tokenizer.tokenize([sentence]), training=False)
    return trained.metadata["class_names"][int(np.argmax(probabilities[0]))]


def test_a_text_folder_runs_the_whole_pipeline_with_bert_tiny_and_serves_raw_text(
        tmp_path, folder):
    from ampflow.pipeline.report import results, results_table
    from ampflow.pipeline.run_local import LocalRunConfig, run_local

    config = LocalRunConfig(
        workdir=tmp_path / "run", text_folder=str(folder), model="bert_tiny",
        max_sequence_length=SEQ, epochs=2, xla="off", with_float32_baseline=False,
        tflite_variants="float32")
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
    # one variant: that every default variant of a text model (full_int8 too, issue 46)
    # passes its gate is tests/test_cli_step_by_step.py's text walk's `ampflow convert`
    conversion = json.loads((result.artifacts["convert-tflite"]["tflite"] / "report.json")
                            .read_text())
    assert {v: r["passed"] for v, r in conversion["variants"].items()} == {"float32": True}
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
    _served_classes_are(config, sentence, expected)


def _served_classes_are(config, sentence: str, expected: str) -> None:
    """`ampflow serve` (in this process, as typed) and `ampflow predict --text` over gRPC and
    REST beside it say it."""
    from cli_walk import serve_while

    from ampflow.cli import main
    from ampflow.serving.client import PredictionClient

    port, rest_port = _free_ports()
    args = ["--wait-s", "60", "--text", sentence]  # as text-models.md types it

    def ask() -> dict[str, tuple[int, list[str]]]:
        # once the server answers, serve's capture of stdout is in place: each predict's
        # own capture nests inside it
        with PredictionClient(f"127.0.0.1:{port}") as client:
            client.wait_until_available(config.model_name, timeout=120)
        lines = {}
        for protocol, at in (("grpc", port), ("rest", rest_port)):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = main(["predict", "--protocol", protocol, "--port", str(at), *args])
            lines[protocol] = code, out.getvalue().splitlines()
        return lines

    serve, lines = serve_while(["serve", "--model-base-path", config.serving_base, "--port",
                                port, "--rest-api-port", rest_port], ask)
    serve.assert_ok()
    assert lines is not None, serve.out[-3000:]
    for protocol, (code, out) in lines.items():
        assert code == 0, (protocol, out, serve.out[-3000:])
        # the server's own lines may land in the same capture: the answer's lines by shape
        assert [x for x in out if x.startswith("model ")] == [
            f"model {config.model_name} version 1 signature serving_default"], (protocol, out)
        # `'text': name (id) probability, ...`: the 3 classes, the best first
        (answer,) = [x for x in out if x.startswith(repr(sentence) + ": ")]
        assert re.fullmatch(r"'[^']+': \w+ \(\d\) [01]\.\d{4}(, \w+ \(\d\) [01]\.\d{4}){2}",
                            answer), (protocol, out)
        assert answer.rsplit(": ", 1)[1].split(" (")[0] == expected, (protocol, out)
