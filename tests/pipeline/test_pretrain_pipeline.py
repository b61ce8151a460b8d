"""`--pretrain-epochs N`: the pipeline pretrains a BERT encoder on its own prepared texts.

The pretrain task (components/pretrain/component.py) takes prepare-data's Dataset and its Model
feeds both train tasks' `base_model`, where `--base-model-uri`'s importer goes otherwise (the
real kfp compiler writes the IR read here). Refused before anything is compiled, written or
sent: pretraining and an imported base model at once (compile, submit, run-local alike, through
PipelineOptions), a negative count, and image data (submit's and run-local's preflight, with
the pretrain step's own line). With a base model, `model` is not what train builds, so text
data with the default `model` is no longer refused for it.
"""

from __future__ import annotations

import pytest
import yaml

from ampflow.cli import main
from ampflow.data.catalog import ROTTEN_TOMATOES_NAME
from ampflow.errors import ConfigError, PipelineError
from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline

IMAGE = "registry.example/ampflow:1"
REMOTE = "gs://bucket/checkpoints/bert_uncased_L-2_H-128_A-2"
UNREACHABLE = "http://127.0.0.1:9"  # nothing is sent: every check here comes first
TEXTS = {"dataset": ROTTEN_TOMATOES_NAME}  # offline text data: its modality known up front
IMAGES = {"dataset": "ampflow_digits"}


def _tasks(path) -> dict:
    return next(yaml.safe_load_all(open(path)))["root"]["dag"]["tasks"]


def _fed_base_model(tasks: dict) -> dict[str, str]:
    """{train task: the task whose output artifact is its base_model}."""
    return {name: task["inputs"]["artifacts"]["base_model"]["taskOutputArtifact"]["producerTask"]
            for name, task in tasks.items()
            if "base_model" in task.get("inputs", {}).get("artifacts", {})}


def test_the_pretrain_task_feeds_both_train_tasks_base_model_only_when_asked(tmp_path):
    tasks = _tasks(compile_pipeline(tmp_path / "p.yaml",
                                    PipelineOptions(gpu=False, pretrain_epochs=2)))
    assert _fed_base_model(tasks) == {"train": "pretrain", "train-2": "pretrain"}
    pretrain = tasks["pretrain"]["inputs"]
    assert pretrain["artifacts"]["data"]["taskOutputArtifact"]["producerTask"] == "prepare-data"
    assert pretrain["parameters"]["epochs"]["runtimeValue"]["constant"] == 2
    # the position table is the length train fine-tunes at; the seed is the run's
    for name in ("max_sequence_length", "seed"):
        assert pretrain["parameters"][name] == {"componentInputParameter": name}, name
    assert "retryPolicy" in tasks["pretrain"]  # configured as the run's other training

    plain = _tasks(compile_pipeline(tmp_path / "q.yaml", PipelineOptions(gpu=False)))
    assert "pretrain" not in plain and _fed_base_model(plain) == {}


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("flags", "says"), [
    (["--pretrain-epochs", "2", "--base-model-uri", REMOTE],
     "--pretrain-epochs and --base-model-uri both give the train tasks their base model"),
    (["--pretrain-epochs", "-1"], "--pretrain-epochs must be an integer >= 0"),
])
def test_compile_refuses_pretraining_with_an_import_or_a_negative_count(tmp_path, capsys, flags,
                                                                      says):
    out = tmp_path / "pipeline.yaml"
    assert main(["compile", "--image", IMAGE, "--output", str(out), *flags]) == 2
    assert says in _one_error_line(capsys)
    assert not out.exists()


def test_submit_refuses_image_data_with_pretraining_before_the_endpoint():
    from ampflow.pipeline.submit import SubmitConfig, submit

    config = SubmitConfig(host=UNREACHABLE, image=IMAGE, pretrain_epochs=2)
    with pytest.raises(ConfigError, match=r"pretrain_epochs pretrains on the run's texts, but "
                                          r"dataset='ampflow_digits' holds images, not texts"):
        submit(config, IMAGES)


@pytest.mark.parametrize("base", [{"pretrain_epochs": 2}, {"base_model_uri": REMOTE}])
def test_submit_takes_text_data_with_a_base_model_whatever_model_says(base):
    # train fine-tunes the base model, not `model` (small_cnn by default): the preflight once
    # refused the run for it ("an image model"); it now goes on to the endpoint
    from ampflow.pipeline.submit import SubmitConfig, submit

    with pytest.raises(PipelineError, match="cannot reach the KFP endpoint"):
        submit(SubmitConfig(host=UNREACHABLE, image=IMAGE, **base), TEXTS)


def test_run_local_takes_pretraining_through_the_shared_options(tmp_path):
    from ampflow.pipeline.run_local import LocalRunConfig

    config = LocalRunConfig(workdir=tmp_path, pretrain_epochs=2, **TEXTS)
    assert config.pipeline_options().pretrain_epochs == 2
    assert "pretrain_epochs" not in config.arguments()  # compile time, not a run parameter
    with pytest.raises(ConfigError, match="holds images, not texts"):
        LocalRunConfig(workdir=tmp_path, pretrain_epochs=2, **IMAGES)
    keras_file = tmp_path / "model.keras"
    keras_file.write_bytes(b"")
    with pytest.raises(ConfigError, match="both give the train tasks their base model"):
        LocalRunConfig(workdir=tmp_path, pretrain_epochs=2, model=str(keras_file), **TEXTS)


def test_the_submit_command_takes_text_data_with_pretraining_whatever_model_says(capsys):
    code = main(["submit", "--image", IMAGE, "--host", UNREACHABLE, "--pretrain-epochs", "2",
                 "--param", f"dataset={ROTTEN_TOMATOES_NAME}"])
    assert code != 0 and "cannot reach the KFP endpoint" in _one_error_line(capsys)


def test_demo_does_not_offer_pretraining_it_could_only_refuse(tmp_path, capsys):
    """The demo queries images and pretraining needs texts: not offered, and refused in its line."""
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert "--pretrain-epochs" not in capsys.readouterr().out
    assert main(["demo", "--pretrain-epochs", "1", "--workdir", str(tmp_path / "d")]) == 2
    assert "--pretrain-epochs pretrains on the run's texts" in _one_error_line(capsys)
    assert not (tmp_path / "d").exists()
