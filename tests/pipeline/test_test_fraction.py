"""The test split's size is the user's to set in the pipeline (issue 46): `test_fraction`.

The gate decides on the test split, so its size decides what the gate can detect. Data without
a test split (a folder of images or texts) get prepare-data's held-out share of each class;
`run-local --test-fraction`, `submit --param test_fraction=` and the compiled pipeline's
parameter take PrepareDataConfig's default and pass it to the prepare-data task, and a share
out of (0, 1) is refused before anything runs.
"""

from __future__ import annotations

import ast
import inspect

import pytest
import yaml
from pipeline_signature import pipeline_signature_defaults

from ampflow.components.prepare_data.config import PrepareDataConfig
from ampflow.errors import ConfigError
from ampflow.pipeline.parameters import PIPELINE_PARAMETERS, check_arguments, parse_param
from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline
from ampflow.pipeline.run_local import LocalRunConfig

HOME = PrepareDataConfig.__dataclass_fields__["test_fraction"].default


def test_every_layer_takes_prepare_datas_default():
    from ampflow.components.prepare_data.component import prepare_data

    local = LocalRunConfig.__dataclass_fields__["test_fraction"].default
    component = inspect.signature(prepare_data).parameters["test_fraction"].default
    assert PIPELINE_PARAMETERS["test_fraction"][1] == local == component == HOME
    assert not isinstance(pipeline_signature_defaults()["test_fraction"], ast.Constant)


def test_the_compiled_pipeline_passes_its_parameter_to_prepare_data(tmp_path):
    path = compile_pipeline(tmp_path / "p.yaml", PipelineOptions(gpu=False))
    spec = next(yaml.safe_load_all(open(path)))
    parameter = dict(spec["root"]["inputDefinitions"]["parameters"]["test_fraction"])
    assert parameter.pop("description")  # the KFP UI's help (test_parameter_descriptions.py)
    assert parameter == {
        "defaultValue": HOME, "isOptional": True, "parameterType": "NUMBER_DOUBLE"}
    task = spec["root"]["dag"]["tasks"]["prepare-data"]
    assert task["inputs"]["parameters"]["test_fraction"] == {
        "componentInputParameter": "test_fraction"}


def test_submit_and_run_local_take_it_and_refuse_a_share_out_of_range(tmp_path):
    assert parse_param("test_fraction=0.3") == ("test_fraction", 0.3)
    check_arguments({"test_fraction": 0.3})
    with pytest.raises(ConfigError, match=r"test_fraction must be in \(0, 1\). Received: "
                                          r"test_fraction=1.5"):
        check_arguments({"test_fraction": 1.5})
    assert LocalRunConfig(workdir=tmp_path, test_fraction=0.3).arguments()["test_fraction"] == 0.3


def test_run_local_refuses_a_bad_test_fraction_in_one_line_before_any_step(tmp_path, capsys):
    from ampflow.cli import main

    workdir = tmp_path / "run"
    assert main(["run-local", "--workdir", str(workdir), "--test-fraction", "0"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("ampflow run-local: error: ") and "test-fraction must be in (0, 1)" in err
    assert not workdir.exists()
