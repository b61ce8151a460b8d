"""The training defaults have one home, the train step's config (TrainConfig): the pipeline's
parameters (its signature, the compiled IR, `submit --help`'s table), `run-local`/`demo`, the
KFP component and the `compile`/`submit` flags (PipelineOptions) all take theirs from there, so
a default changed there changes everywhere and one restated by hand fails here."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect

import pytest
import yaml
from pipeline_signature import pipeline_signature_defaults

from ampflow.cliutil import TRISTATE
from ampflow.components.train.config import TrainConfig
from ampflow.pipeline.parameters import PIPELINE_PARAMETERS
from ampflow.pipeline.pipeline import (
    MODEL_LEARNING_RATE,
    TRAIN_DEFAULTS,
    PipelineOptions,
    compile_pipeline,
)
from ampflow.pipeline.run_local import LocalRunConfig

# Pipeline parameter -> TrainConfig field (the same name, but for XLA).
TRAINING = {"model": "model", "epochs": "epochs", "batch_size": "batch_size",
            "accumulation_steps": "accumulation_steps", "learning_rate": "learning_rate",
            "precision": "precision", "seed": "seed",
            "xla": "jit_compile", "weights": "weights", "head_epochs": "head_epochs",
            "head_learning_rate": "head_learning_rate"}
# run-local/demo train under mixed_float16 on purpose (loss scaling runs even on a CPU).
LOCAL_ON_PURPOSE = {"precision": "mixed_float16"}


def _home(parameter: str):
    value = TrainConfig.__dataclass_fields__[TRAINING[parameter]].default
    if parameter == "learning_rate" and value is None:  # the model's own: 0 in KFP (no None)
        return MODEL_LEARNING_RATE
    if parameter == "weights" and value is None:  # no file: "" in KFP (no None)
        return ""
    return next(w for w, v in TRISTATE.items() if v is value) if parameter == "xla" else value


def test_train_defaults_are_the_train_steps_own():
    assert TRAIN_DEFAULTS == {name: _home(name) for name in TRAINING}


def test_the_compiled_pipeline_and_its_parameter_table_take_the_train_defaults(tmp_path):
    path = compile_pipeline(tmp_path / "p.yaml", PipelineOptions(gpu=False))
    params = next(yaml.safe_load_all(open(path)))["root"]["inputDefinitions"]["parameters"]
    for name in TRAINING:
        assert params[name]["defaultValue"] == _home(name), name
        assert PIPELINE_PARAMETERS[name][1] == _home(name), name


def test_run_local_takes_the_train_defaults():
    local = {f.name: f.default for f in dataclasses.fields(LocalRunConfig)}
    for name in TRAINING:
        assert local[name] == LOCAL_ON_PURPOSE.get(name, _home(name)), name


def test_the_kfp_components_spelt_out_defaults_are_the_train_steps():
    # the component's source is copied into its task, so it spells its defaults out
    from ampflow.components.train.component import train

    signature = inspect.signature(train).parameters
    component_names = {"model": "architecture"}
    for name in TRAINING:
        assert signature[component_names.get(name, name)].default == _home(name), name


def test_the_signatures_restate_no_training_default():
    """The pipeline's signature reads TRAIN_DEFAULTS: a literal there is a second home."""
    defaults = pipeline_signature_defaults()
    for name in TRAINING:
        assert not isinstance(defaults[name], ast.Constant), (
            f"ampflow_pipeline's {name} default is a literal; use TRAIN_DEFAULTS[{name!r}]")


@pytest.mark.parametrize("command", ["compile", "submit"])
def test_compile_and_submit_flags_take_their_defaults_from_pipeline_options(command):
    from ampflow.cli import build_parser
    from ampflow.pipeline.pipeline import cli_fields

    parser = build_parser(("ampflow.pipeline.cli",))
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = {a.dest: a for a in sub.choices[command]._actions}
    fields = {f.name: f for f in dataclasses.fields(PipelineOptions)}
    assert set(cli_fields()) - {"image"} <= set(actions)
    for name in cli_fields():
        if name == "image":
            continue  # required unless $AMPFLOW_IMAGE: tests/test_cli.py
        assert actions[name].default == fields[name].default, name


def test_the_data_and_tflite_parameters_take_their_steps_defaults(tmp_path):
    from ampflow.components.convert_tflite.component import convert_tflite
    from ampflow.components.convert_tflite.config import ConvertConfig
    from ampflow.components.prepare_data.config import PrepareDataConfig

    homes = {"dataset": PrepareDataConfig.__dataclass_fields__["dataset"].default,
             "tflite_variants": ",".join(ConvertConfig.__dataclass_fields__["variants"].default)}
    path = compile_pipeline(tmp_path / "p.yaml", PipelineOptions(gpu=False))
    params = next(yaml.safe_load_all(open(path)))["root"]["inputDefinitions"]["parameters"]
    local = {f.name: f.default for f in dataclasses.fields(LocalRunConfig)}
    for name, home in homes.items():
        assert params[name]["defaultValue"] == PIPELINE_PARAMETERS[name][1] == local[name] == home
    # prepare_data's component has no default dataset: the pipeline always passes one
    assert inspect.signature(convert_tflite).parameters["variants"].default == homes[
        "tflite_variants"]


ALLREDUCE = ("packed_allreduce", "allreduce_bytes_per_pack", "allreduce_dtype")


def test_the_allreduce_options_take_the_train_steps_defaults():
    # compile/submit (PipelineOptions), run-local and the KFP component spell out none of them
    from ampflow.components.train.component import train

    component = inspect.signature(train).parameters
    options = {f.name: f for f in dataclasses.fields(PipelineOptions)}
    local = {f.name: f.default for f in dataclasses.fields(LocalRunConfig)}
    for name in ALLREDUCE:
        home = TrainConfig.__dataclass_fields__[name]
        assert options[name].default == local[name] == component[name].default == home.default
        assert options[name].metadata.get("choices") == home.metadata.get("choices"), name
