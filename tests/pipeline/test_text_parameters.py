"""The pipeline's text parameters: one home each, and checked before anything runs.

prepare-data's text source and reading settings have their home in PrepareDataConfig, train's
sequence length and vocabulary in TrainConfig (from TokenizerConfig): the pipeline's signature,
its parameter table (`submit --help`, `--param`), `run-local`/`demo`'s flags and the KFP
components' spelt-out defaults all take theirs from there (the compiled IR's defaults are the
table's: test_compile_submit.py). A bad combination (a text table and an image folder, a text
model on digits, a sequence length of 0, a folder that is not there) is one line, exit 2,
before any step runs and before the workdir is made.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
from pipeline_signature import pipeline_signature_defaults

from ampflow.components.prepare_data.config import PrepareDataConfig
from ampflow.components.train.config import TrainConfig
from ampflow.errors import ConfigError
from ampflow.modeling.tokenizer import TokenizerConfig
from ampflow.pipeline.parameters import PIPELINE_PARAMETERS, check_arguments, parse_param
from ampflow.pipeline.pipeline import TEXT_DEFAULTS
from ampflow.pipeline.run_local import LocalRunConfig

DATA = ("text_folder", "text_file", "text_column", "label_column", "text_feature",
        "max_text_bytes")
TRAIN = ("max_sequence_length", "vocabulary_size")
VARIANTS = "float32,float16,dynamic_range"


def _home(name: str):
    """The field's own default; a path or name that is None there is "" (KFP has no None)."""
    if name in TRAIN:
        value = TokenizerConfig.__dataclass_fields__[name].default
        assert TrainConfig.__dataclass_fields__[name].default == value, name
        return value
    value = PrepareDataConfig.__dataclass_fields__[name].default
    return "" if value is None else value


def _home_help(name: str) -> str:
    config = TrainConfig if name in TRAIN else PrepareDataConfig
    return config.__dataclass_fields__[name].metadata["help"]


def test_every_text_parameter_defaults_to_its_steps_field():
    assert set(TEXT_DEFAULTS) == set(DATA + TRAIN)
    local = {f.name: f for f in dataclasses.fields(LocalRunConfig)}
    for name in DATA + TRAIN:
        assert TEXT_DEFAULTS[name] == PIPELINE_PARAMETERS[name][1] == _home(name), name
        assert local[name].default == _home(name), name
        assert local[name].metadata["help"] == _home_help(name), name  # the flag's help too


def test_the_kfp_components_spelt_out_text_defaults_are_the_steps():
    # a component's source is copied into its task, so it spells its defaults out
    from ampflow.components.prepare_data.component import prepare_data
    from ampflow.components.train.component import train

    for component, names in ((prepare_data, DATA), (train, TRAIN)):
        signature = inspect.signature(component).parameters
        for name in names:
            assert signature[name].default == _home(name), name


def test_the_pipelines_signature_restates_no_text_default():
    defaults = pipeline_signature_defaults()
    for name in DATA + TRAIN:
        assert not isinstance(defaults[name], ast.Constant), name


def test_submit_takes_the_text_parameters_typed():
    assert parse_param("max_sequence_length=48") == ("max_sequence_length", 48)
    assert parse_param("text_folder=/data/reviews") == ("text_folder", "/data/reviews")
    with pytest.raises(ConfigError, match="max_text_bytes must be of type int"):
        parse_param("max_text_bytes=1MB")
    check_arguments({"text_folder": "/data/reviews", "model": "bert_tiny",
                     "max_sequence_length": 48, "vocabulary_size": 5000,
                     "tflite_variants": VARIANTS})
    check_arguments({"dataset": "ampflow_rotten_tomatoes", "model": "bert_mini",
                     "tflite_variants": "float16"})
    check_arguments({"text_file": "t.csv", "model": "my_models.text:build"})  # may pass int8
    check_arguments({"dataset": "imdb_reviews", "model": "bert_tiny"})  # a TFDS name: train says
    check_arguments({"dataset": "imdb_reviews", "model": "small_cnn"})


@pytest.mark.parametrize("arguments, message", [
    ({"text_file": "t.csv", "image_folder": "photos", "model": "bert_tiny"},
     r"image_folder and text_file are alternatives"),
    ({"text_folder": "texts", "dataset": "imdb_reviews", "model": "bert_tiny"},
     r"text_folder and dataset are alternatives"),
    ({"model": "bert_tiny"},
     r"model 'bert_tiny' is a text model .*dataset='ampflow_digits' holds images"),
    ({"image_folder": "photos", "model": "bert_tiny"}, r"image_folder='photos' holds images"),
    ({"text_folder": "texts"}, r"model 'small_cnn' is an image model .*text_folder='texts' "
                               r"holds text: choose one of bert_base"),
    ({"text_folder": "texts", "model": "bert_tiny", "max_sequence_length": 0},
     r"max_sequence_length must be an integer between 1 and"),
    ({"text_folder": "texts", "model": "bert_tiny", "vocabulary_size": 2},
     r"vocabulary_size must be an integer >= 3"),
    ({"max_sequence_length": 64}, r"max_sequence_length is for text data, and "
                                  r"dataset='ampflow_digits' holds images"),
    ({"text_file": "t.csv", "model": "bert_tiny", "text_column": "label"},
     r"text_column and label_column must be two columns"),
    ({"text_folder": "texts", "model": "bert_tiny", "text_feature": "review"},
     r"text_feature names a feature of a TFDS --dataset"),
    ({"text_folder": "texts", "model": "bert_tiny", "max_text_bytes": 0},
     r"max_text_bytes must be a positive integer"),
    ({"text_folder": "texts", "model": "bert_tiny", "image_size": "32"},
     r"image_size applies to images"),
])
def test_submit_refuses_text_settings_that_cannot_run_before_anything_is_sent(arguments,
                                                                               message):
    with pytest.raises(ConfigError, match=message):
        check_arguments(arguments)


@pytest.mark.parametrize("name, uri", [("text_folder", "gs://bucket/texts"),
                                       ("text_file", "s3://bucket/tickets.csv"),
                                       ("image_folder", "gs://bucket/photos")])
def test_submit_refuses_an_object_store_uri_the_data_step_cannot_read(name, uri):
    """prepare-data reads local files: a gs:// folder passed submit's check, then failed in the
    pod as 'missing' after the run had started (issue 46)."""
    model = "small_cnn" if name == "image_folder" else "bert_tiny"
    with pytest.raises(ConfigError, match=rf"{name} must be a path on the file system of the "
                       rf"machine or pod that runs prepare-data .*kubeflow.md#your-own-data-on-a-"
                       rf"cluster\). Received: {name}='{uri}'"):
        check_arguments({name: uri, "model": model, "tflite_variants": VARIANTS})
    check_arguments({name: "/data/in/the/image", "model": model, "tflite_variants": VARIANTS})


def test_prepare_data_refuses_a_uri_in_one_line(tmp_path, capsys):
    from ampflow.cli import main

    assert main(["prepare-data", "--text-folder", "gs://bucket/texts",
                 "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--text-folder must be a path on the file system" in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", [["--text-folder", "{tmp}/texts"],
                                    ["--dataset", "ampflow_rotten_tomatoes"]])
def test_demo_refuses_text_before_a_step_runs(tmp_path, capsys, source):
    """The demo queries test images: on text it trained for minutes, then failed at its query
    ("holds text data, not images"). Now one line up front says where the text path is."""
    from ampflow.cli import main

    (tmp_path / "texts").mkdir()
    workdir = tmp_path / "run"
    assert main(["demo", "--workdir", str(workdir), "--model", "bert_tiny", "--tflite-variants",
                 VARIANTS, *(flag.format(tmp=tmp_path) for flag in source)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("ampflow demo: error: the demo queries images") and (
        "run-local" in err[0] and "predict --text" in err[0]), err
    assert not workdir.exists()


@pytest.mark.parametrize("model", ["bert_tiny", "bert_base"])
def test_a_built_in_text_model_with_the_default_variants_is_not_refused(model, tmp_path,
                                                                        monkeypatch):
    """Issue 46: full_int8 among the defaults was refused for a built-in text model.

    Its attention and mean pooling now quantize (docs/how-to/text-models.md, "full_int8 of a
    text model"): submit's check and run-local's pass the defaults, all four variants.
    """
    assert PIPELINE_PARAMETERS["tflite_variants"][1] == "float32,float16,dynamic_range,full_int8"
    check_arguments({"text_folder": "/data/reviews", "model": model})
    check_arguments({"dataset": "ampflow_rotten_tomatoes", "model": model})
    (tmp_path / "texts").mkdir()
    monkeypatch.chdir(tmp_path)
    check_arguments(LocalRunConfig(workdir=Path("run"), text_folder="texts",
                                   model=model).arguments())


def test_run_local_takes_text_flags_and_gives_the_step_absolute_paths(tmp_path, monkeypatch):
    (tmp_path / "texts").mkdir()
    (tmp_path / "t.csv").write_text("text,label\nfine,a\n")
    monkeypatch.chdir(tmp_path)
    folder = LocalRunConfig(workdir=Path("run"), text_folder="texts", model="bert_tiny",
                            max_sequence_length=32, tflite_variants=VARIANTS)
    arguments = folder.arguments()
    assert arguments["text_folder"] == str(tmp_path / "texts")  # each step runs elsewhere
    assert arguments["max_sequence_length"] == 32
    check_arguments(arguments)  # run-local passes exactly the pipeline's parameters
    table = LocalRunConfig(workdir=Path("run"), text_file="t.csv", model="bert_tiny",
                           tflite_variants="float32")
    assert table.arguments()["text_file"] == str(tmp_path / "t.csv")


@pytest.mark.parametrize("flags, message", [
    (["--text-folder", "{tmp}/absent", "--model", "bert_tiny"],
     "--text-folder must be an existing folder. Received: --text-folder="),
    (["--text-file", "{tmp}/absent.csv", "--model", "bert_tiny"],
     "--text-file must be an existing file"),
    (["--text-file", "{tmp}/t.csv", "--image-folder", "{tmp}/texts"],
     "--image-folder and --text-file are alternatives: pass one of them"),
    (["--model", "bert_tiny"], "model 'bert_tiny' is a text model (it takes token ids), and "
                               "--dataset='ampflow_digits' holds images"),
    (["--text-folder", "{tmp}/texts", "--model", "bert_tiny", "--max-sequence-length", "0"],
     "--max-sequence-length must be an integer between 1 and 4096. Received: "
     "--max-sequence-length=0"),
])
def test_run_local_refuses_in_one_line_before_any_step(tmp_path, capsys, flags, message):
    from ampflow.cli import main

    (tmp_path / "texts").mkdir()
    (tmp_path / "t.csv").write_text("text,label\nfine,a\n")
    workdir = tmp_path / "run"
    argv = ["run-local", "--workdir", str(workdir),
            *(flag.format(tmp=tmp_path) for flag in flags)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("ampflow run-local: error: ") and message in err[0], err
    assert not workdir.exists()  # nothing ran, nothing was written


def test_the_data_step_line_says_the_texts_and_what_was_left_out_by_reason(tmp_path):
    import json

    from ampflow.pipeline.report import step_headline

    (tmp_path / "data").mkdir()
    info = {"name": "ampflow_text_folder", "modality": "text", "splits": {"train": 270,
                                                                           "test": 60},
            "skipped_files": {"count": 3, "by_reason": {"not UTF-8": 2, "empty": 1}}}
    (tmp_path / "data" / "dataset_info.json").write_text(json.dumps(info))
    assert step_headline("prepare-data", tmp_path) == (
        "ampflow_text_folder: 270 train, 60 test texts; 3 files or rows left out (not UTF-8: "
        "2, empty: 1)")
    info.update(skipped_files={"count": 0, "by_reason": {}})
    (tmp_path / "data" / "dataset_info.json").write_text(json.dumps(info))
    assert step_headline("prepare-data", tmp_path).endswith("60 test texts; none left out")
    images = {"name": "ampflow_digits", "modality": "image", "splits": {"train": 1438,
                                                                         "test": 359}}
    (tmp_path / "data" / "dataset_info.json").write_text(json.dumps(images))
    assert step_headline("prepare-data", tmp_path) == "ampflow_digits: 1438 train, 359 test images"
