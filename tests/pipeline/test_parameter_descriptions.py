"""Every input of the compiled pipeline carries a description, the help the KFP UI shows.

The root's parameters (the run form) and each component's inputs get theirs from the
components' `Args:`, which `ampflow.kfp_args.document_args` writes from the step configs'
field help: one home per text. A parameter no source describes is caught here, by compiling
with the real kfp compiler.
"""

import pytest
from kfp import compiler, dsl

from ampflow.components.train.config import TrainConfig
from ampflow.files import yaml_documents
from ampflow.kfp_args import described, docstring_args, document_args
from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline


def undescribed(ir: dict) -> list[str]:
    """`where: input` for each input of the root and of each container step without one.

    KFP's own components are not checked: a `comp-condition-*` DAG (a `dsl.If`'s copies of
    the root's channels) and `dsl.importer`'s (its `uri`, a constant), which no one fills in.
    """
    executors = ir["deploymentSpec"]["executors"]
    specs = {"root": ir["root"], **{name: spec for name, spec in ir["components"].items()
                                    if "container" in executors.get(spec.get("executorLabel"),
                                                                    {})}}
    return [f"{where}: {name}" for where, spec in specs.items()
            for kind in ("parameters", "artifacts")
            for name, entry in spec.get("inputDefinitions", {}).get(kind, {}).items()
            if not entry.get("description", "").strip()]


def _compiled(tmp_path, pipeline) -> dict:
    path = tmp_path / "p.yaml"
    compiler.Compiler().compile(pipeline, package_path=str(path))
    return yaml_documents(path.read_text())[0]


@pytest.fixture(scope="module")
def ir(tmp_path_factory) -> dict:
    options = PipelineOptions(gpu=False, base_model_uri="gs://bucket/base.keras")
    path = compile_pipeline(tmp_path_factory.mktemp("ir") / "p.yaml", options)
    return yaml_documents(open(path).read())[0]


def test_every_input_of_the_compiled_pipeline_has_a_description(ir):
    assert undescribed(ir) == []
    assert len(ir["root"]["inputDefinitions"]["parameters"]) >= 39
    assert {"comp-train", "comp-deploy-serving", "comp-compare-serving"} <= set(ir["components"])


def test_a_root_parameter_says_what_the_train_steps_flag_says(ir):
    params = ir["root"]["inputDefinitions"]["parameters"]
    train = described(TrainConfig)
    assert params["epochs"]["description"] == train["epochs"]
    assert params["model"]["description"] == train["model"]  # set through `architecture`
    assert params["learning_rate"]["description"].startswith(train["learning_rate"])
    assert "0: the model's own" in params["learning_rate"]["description"]
    assert ir["components"]["comp-train"]["inputDefinitions"]["parameters"]["epochs"][
        "description"] == train["epochs"]


def test_a_planted_parameter_without_a_description_is_caught(tmp_path):
    def step(epochs: int = 1, planted: str = ""):
        """A step."""

    document_args(step, TrainConfig)  # `planted` is no field of TrainConfig
    component = dsl.component(step, base_image="python:3.11", install_kfp_package=False)

    def pipeline(epochs: int = 1, unknown: str = ""):
        """A pipeline."""
        component(epochs=epochs, planted=unknown)

    assert undescribed(_compiled(tmp_path, dsl.pipeline(name="planted")(pipeline))) == [
        "root: epochs", "root: unknown", "comp-step: planted"]
    document_args(pipeline, step)  # the root's epochs: what step's epochs says
    assert undescribed(_compiled(tmp_path, dsl.pipeline(name="planted")(pipeline))) == [
        "root: unknown", "comp-step: planted"]


def test_document_args_writes_one_line_per_input_in_signature_order():
    def step(b: int, a: str = "x", c: float = 0.0):
        """Summary.

        Why it exists.
        """

    document_args(step, own={"a": "The a.", "b": "The b."}, notes={"a": "Empty: none"})
    assert step.__doc__.splitlines()[:3] == ["Summary.", "", "Why it exists."]
    assert docstring_args(step.__doc__) == {"b": "The b.", "a": "The a. Empty: none."}


def test_document_args_refuses_a_text_for_no_parameter_and_a_missing_summary():
    def step(a: int):
        """Summary."""

    with pytest.raises(ValueError, match="not its parameters. Received: typo"):
        document_args(step, own={"typo": "The typo."})

    def bare(a: int):
        pass

    with pytest.raises(ValueError, match="needs a docstring with a summary line"):
        document_args(bare, own={"a": "The a."})
