"""The pretrain KFP component: the prepared Dataset in, a Hugging Face checkpoint Model out.

Its function is called in process with real KFP artifact objects (the wrapping: artifact
paths in, the losses as KFP metrics, the Model's metadata), at the smallest sizes; its spelt-out
defaults are tied to the step's own (PretrainStepConfig). The pipeline's wiring of its Model
into train's `base_model` is tests/pipeline/test_pretrain_pipeline.py's.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from kfp import dsl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tiny_text_model import SEQ, TEST_ONLY_WORD, prepared_texts  # noqa: E402

from ampflow.components.pretrain.component import pretrain  # noqa: E402
from ampflow.components.pretrain.config import PretrainStepConfig  # noqa: E402
from ampflow.errors import ConfigError  # noqa: E402
from ampflow.pipeline.report import key_metrics, step_headline  # noqa: E402

TINY = {"num_hidden_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
        "max_sequence_length": SEQ, "vocabulary_size": 120, "epochs": 2, "batch_size": 8,
        "steps_per_epoch": 2}
# A KFP parameter has no None: the step's None is 0 in the component.
KFP_NONE = {"steps_per_epoch": 0}


def _outputs(tmp_path: Path) -> dict:
    return {"model": dsl.Model(uri=str(tmp_path / "model")),
            "metrics": dsl.Metrics(uri=str(tmp_path / "metrics"))}


def test_the_components_spelt_out_defaults_are_the_pretrain_steps():
    # the component's source is copied into its task, so it spells its defaults out
    component = inspect.signature(pretrain).parameters
    step = {f.name: f.default for f in dataclasses.fields(PretrainStepConfig)
            if f.default is not dataclasses.MISSING}
    assert set(step) == set(component) - {"data", "model", "metrics"}
    for name, default in step.items():
        assert component[name].default == KFP_NONE.get(name, default), name


@pytest.mark.slow
def test_the_component_publishes_a_checkpoint_read_hf_bert_reads_and_its_losses(
        tmp_path_factory, tmp_path):
    from ampflow.modeling.hf_bert import read_hf_bert

    outputs = _outputs(tmp_path)
    pretrain(data=dsl.Dataset(uri=str(prepared_texts(tmp_path_factory))), **outputs, **TINY)
    checkpoint = read_hf_bert(tmp_path / "model")  # the reader of train's base_model
    assert (checkpoint.config.num_hidden_layers, checkpoint.config.hidden_size) == (1, 16)
    assert checkpoint.config.max_position_embeddings == SEQ
    assert TEST_ONLY_WORD not in checkpoint.vocabulary  # the training split only
    logged = outputs["metrics"].metadata
    assert {"masked_lm_loss_first_epoch", "masked_lm_loss_last_epoch"} <= set(logged)
    assert all(value > 0 for value in logged.values())
    assert logged["steps_per_epoch"] == 2
    meta = outputs["model"].metadata
    assert (meta["format"], meta["model_type"], meta["max_position_embeddings"]) == (
        "huggingface", "bert", SEQ)
    assert meta["vocabulary_size"] == len(checkpoint.vocabulary)
    # run-local's line for the task and its row of the results (the local runner's layout:
    # <task dir>/model), by their form, not their numbers
    assert re.fullmatch(r"\d+ texts, masked-LM loss \d+\.\d{3} \(epoch 1\) -> \d+\.\d{3} "
                        r"\(epoch 2\)", step_headline("pretrain", tmp_path))
    run = SimpleNamespace(artifacts={"pretrain": {"model": tmp_path / "model"}})
    assert re.fullmatch(r"\d+\.\d{3} \(epoch 1\) -> \d+\.\d{3} \(epoch 2\), \d+ texts",
                        key_metrics(run)["pretrain.masked_lm_loss"])


def test_an_image_dataset_fails_the_task_with_the_steps_one_line(prepared_digits, tmp_path):
    with pytest.raises(ConfigError, match="not texts: masked-LM pretraining needs a text"):
        pretrain(data=dsl.Dataset(uri=str(prepared_digits)), **_outputs(tmp_path), **TINY)
    assert not (tmp_path / "model").exists()


def test_artifact_paths_given_as_text_reach_the_existing_folder_refusal(tmp_path_factory,
                                                                        tmp_path):
    # a KFP artifact's `path` is a str: the config takes it as a Path, as the CLI gives it
    from ampflow.components.pretrain import run_pretrain

    taken = tmp_path / "model"
    taken.mkdir()
    config = PretrainStepConfig(data_dir=str(prepared_texts(tmp_path_factory)),
                                output_dir=str(taken))
    assert isinstance(config.output_dir, Path) and isinstance(config.data_dir, Path)
    with pytest.raises(ConfigError, match="exists: a checkpoint is written to a new folder"):
        run_pretrain(config)


def test_the_component_compiles_over_our_image_with_the_steps_help_as_its_args():
    from ampflow.pipeline.settings import as_component

    component = as_component(pretrain, "registry.example/ampflow:9.9")
    spec = component.component_spec
    assert spec.implementation.container.image == "registry.example/ampflow:9.9"
    assert set(spec.outputs) == {"model", "metrics"}
    help_of = PretrainStepConfig.__dataclass_fields__["mask_rate"].metadata["help"]
    assert spec.inputs["mask_rate"].description.startswith(help_of[:40])
