"""A pretrained BERT checkpoint through the pipeline: an input artifact of the train tasks.

`--base-model-uri` (compile, submit) and `run-local --model DIR` bring the checkpoint in with
`dsl.importer` as the train tasks' `base_model` input (issue 48 point 4): the real kfp compiler
writes the importer into the IR; `compile`/`submit` refuse, before anything is written or sent,
a local path (a train pod does not see it; a bad one is named for what is wrong with it first),
a hub handle and a scheme the launcher cannot fetch, and take a gs:// URI as it is; `run-local`
reads a checkpoint dir as train will. The real local runner then imports a tiny checkpoint in
the Hugging Face layout, written by the test, into the real train component (slow).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "modeling"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_bert_files import VOCABULARY, write_hf_bert  # noqa: E402

from ampflow.cli import main  # noqa: E402
from ampflow.errors import ConfigError  # noqa: E402

IMAGE = "registry.example/ampflow:1"
REMOTE = "gs://bucket/checkpoints/bert_uncased_L-2_H-128_A-2"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("ckpt") / "bert_uncased_tiny"
    write_hf_bert(directory, layers=1, hidden=16, heads=2, intermediate=32, positions=32)
    return directory


def _importer_feeds(ir_path: Path) -> tuple[str, set[str]]:
    """The importer's URI, and the tasks its artifact feeds as `base_model`."""
    ir = next(yaml.safe_load_all(ir_path.read_text()))
    (importer,) = [spec["importer"] for spec in ir["deploymentSpec"]["executors"].values()
                   if "importer" in spec]
    assert importer["typeSchema"]["schemaTitle"] == "system.Model"
    fed = {name for name, task in ir["root"]["dag"]["tasks"].items()
           if "base_model" in task.get("inputs", {}).get("artifacts", {})}
    return importer["artifactUri"]["constant"], fed


def test_compile_takes_a_remote_checkpoint_as_an_importer_of_both_train_tasks(tmp_path, capsys):
    out = tmp_path / "pipeline.yaml"
    assert main(["compile", "--image", IMAGE, "--base-model-uri", REMOTE,
                 "--output", str(out)]) == 0
    assert _importer_feeds(out) == (REMOTE, {"train", "train-2"})  # AMP and float32 alike
    assert "remote, not checked here" in capsys.readouterr().out


@pytest.mark.parametrize(("make", "says"), [
    (lambda c, t: t / "absent", "no such file or directory"),
    (lambda c, t: t, "neither model.keras nor config.json"),
    (lambda c, t: _broken_copy(c, t), "expected model_type 'bert'"),
    (lambda c, t: c, "a train pod does not see this machine's files"),  # a good one too
    (lambda c, t: "hf://google/bert_uncased_L-2_H-128_A-2", "huggingface-cli download"),
    (lambda c, t: "https://example.com/bert", "a URI KFP's launcher fetches"),
])
def test_compile_refuses_a_base_model_a_train_pod_cannot_read_before_writing(
        checkpoint, tmp_path, capsys, make, says):
    uri = str(make(checkpoint, tmp_path))
    out = tmp_path / "pipeline.yaml"
    assert main(["compile", "--image", IMAGE, "--base-model-uri", uri,
                 "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()


def _broken_copy(checkpoint: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / "gpt2"
    shutil.copytree(checkpoint, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    return copy


def test_submit_refuses_a_local_checkpoint_before_it_reaches_the_endpoint(checkpoint):
    from ampflow.pipeline.parameters import check_arguments
    from ampflow.pipeline.submit import SubmitConfig, submit

    unreachable = "http://127.0.0.1:9"  # nothing is sent: the refusal comes first
    with pytest.raises(ConfigError, match="a train pod does not see"):
        submit(SubmitConfig(host=unreachable, image=IMAGE, base_model_uri=str(checkpoint)))
    with pytest.raises(ConfigError, match="--param model must be a built-in or a builder"):
        check_arguments({"model": str(checkpoint)})  # the path, as a run parameter
    check_arguments({"model": "small_cnn"})


def test_run_local_imports_a_checkpoint_dir_by_its_absolute_path(checkpoint, tmp_path,
                                                                 monkeypatch):
    from ampflow.pipeline.run_local import LocalRunConfig

    monkeypatch.chdir(checkpoint.parent)  # a relative --model, as a user types it
    texts = {"workdir": tmp_path, "text_folder": str(tmp_path)}  # text data, as a BERT takes
    config = LocalRunConfig(**texts, model=checkpoint.name, max_sequence_length=16)
    assert config.base_model_uri == str(checkpoint)
    assert config.pipeline_options().base_model_uri == str(checkpoint)
    with pytest.raises(ConfigError, match="at most 32, the max_position_embeddings"):
        LocalRunConfig(**texts, model=checkpoint.name, max_sequence_length=64)


def test_the_train_component_takes_each_imported_form_as_its_model(checkpoint, tmp_path):
    from ampflow.modeling.base_model import model_argument

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.keras").write_bytes(b"")
    assert model_argument(str(model_dir)) == str(model_dir / "model.keras")
    assert model_argument(str(checkpoint)) == str(checkpoint)  # train reads the dir itself
    assert model_argument(str(model_dir / "model.keras")) == str(model_dir / "model.keras")


@pytest.mark.slow
def test_the_local_runner_imports_a_checkpoint_into_the_train_component(
        checkpoint, tmp_path_factory, tmp_path, monkeypatch):
    """The real importer and train component under the real SubprocessRunner: one epoch."""
    from kfp import dsl, local
    from tiny_text_model import prepared_texts

    from ampflow.components.train.component import train
    from ampflow.pipeline.settings import as_component

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    data_dir = prepared_texts(tmp_path_factory)
    train_op = as_component(train)

    @dsl.pipeline
    def fine_tune():
        data = dsl.importer(artifact_uri=str(data_dir), artifact_class=dsl.Dataset)
        base = dsl.importer(artifact_uri=str(checkpoint), artifact_class=dsl.Model)
        train_op(data=data.output, base_model=base.output, precision="float32",
                 xla="off", epochs=1, batch_size=64, max_sequence_length=16)

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path),
               raise_on_error=True)
    fine_tune()
    (model_dir,) = tmp_path.glob("fine-tune-*/train/model")
    metadata = json.loads((model_dir / "metadata.json").read_text())
    assert metadata["model"]["kind"] == "checkpoint"
    assert metadata["architecture"] == str(checkpoint)
    assert (model_dir / "vocab.txt").read_text().split("\n")[:-1] == VOCABULARY
