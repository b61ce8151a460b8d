"""The pipeline with a user's model: the builder's import path and a .keras file to fine-tune."""

import yaml

from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline


def _ir(tmp_path, **options):
    path = compile_pipeline(tmp_path / "p.yaml", PipelineOptions(**options))
    return next(yaml.safe_load_all(open(path)))  # the pipeline spec (the platform spec follows)


def test_base_model_uri_compiles_an_importer_feeding_both_train_tasks(tmp_path):
    uri = "gs://bucket/models/resnet/model.keras"
    ir = _ir(tmp_path, base_model_uri=uri)
    importers = {name: spec for name, spec in ir["deploymentSpec"]["executors"].items()
                 if "importer" in spec}
    assert len(importers) == 1
    (importer,) = importers.values()
    assert importer["importer"]["artifactUri"]["constant"] == uri
    assert importer["importer"]["typeSchema"]["schemaTitle"] == "system.Model"
    tasks = ir["root"]["dag"]["tasks"]
    fed = {name for name, task in tasks.items()
           if "base_model" in task.get("inputs", {}).get("artifacts", {})}
    assert fed == {"train", "train-2"}  # the AMP task and the float32 baseline alike
    for name in fed:
        source = tasks[name]["inputs"]["artifacts"]["base_model"]["taskOutputArtifact"]
        assert tasks[source["producerTask"]]["componentRef"]["name"].startswith("comp-importer")


def test_default_compile_has_no_importer_and_passes_model_path(tmp_path):
    ir = _ir(tmp_path)
    assert not any("importer" in spec for spec in ir["deploymentSpec"]["executors"].values())
    assert ir["root"]["inputDefinitions"]["parameters"]["model_path"]["defaultValue"] == ""
    train = ir["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
    assert train["model_path"]["componentInputParameter"] == "model_path"


def test_local_config_turns_a_keras_model_into_the_importer_option(tmp_path):
    from ampflow.pipeline.demo import DemoConfig as LocalRunConfig  # (its subclass: same fields)

    file = tmp_path / "model.keras"
    config = LocalRunConfig(workdir=tmp_path, model=str(file), model_path=str(tmp_path))
    assert config.base_model_uri == str(file.resolve())
    assert config.arguments()["model_path"] == str(tmp_path.resolve())
    assert LocalRunConfig(workdir=tmp_path).base_model_uri is None
