"""A custom layer Keras cannot reload is refused before training (issue 38 part 2).

Before: a layer whose `__init__` takes no `**kwargs` passed `check-model` and `train`, and
`evaluate` then failed with "model.keras could not be loaded (corrupt?)" and ~15 lines of
Keras text. Now `check-model` and the start of `train` save the built model to a `.keras` in
a temporary dir, load it back with the user's module importable, and refuse in one line that
names the layer, the cause and the fix. The train test runs in this process and is refused
before anything is trained (its output dir holds no checkpoint and no model).
"""

from __future__ import annotations

import re
import textwrap

import pytest

from ampflow.errors import ConfigError

LAYERS = textwrap.dedent('''
    import keras
    from keras import layers


    class NoKwargs(layers.Layer):
        """Saves fine; Keras cannot pass back name/trainable/dtype when it loads it."""

        def __init__(self, factor=2.0):
            super().__init__()
            self.factor = factor

        def call(self, x):
            return x * self.factor


    class Scaled(layers.Layer):
        """A get_config that forgets an __init__ argument."""

        def __init__(self, factor, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

        def get_config(self):
            return super().get_config()  # without "factor"

        def call(self, x):
            return x * self.factor


    class Good(layers.Layer):
        def __init__(self, factor=2.0, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

        def get_config(self):
            return {**super().get_config(), "factor": self.factor}

        def call(self, x):
            return x * self.factor


    def _build(layer, input_shape, num_classes):
        inputs = keras.Input(shape=input_shape)
        x = layers.Rescaling(1 / 255.0)(inputs)
        x = layers.Flatten()(x)
        x = layer(x)
        return keras.Model(inputs, layers.Dense(num_classes)(x))


    def no_kwargs(input_shape, num_classes):
        return _build(NoKwargs(), input_shape, num_classes)


    def forgets_an_argument(input_shape, num_classes):
        return _build(Scaled(3.0, name="scaled"), input_shape, num_classes)


    def good(input_shape, num_classes):
        return _build(Good(name="good"), input_shape, num_classes)
''')


@pytest.fixture(scope="module")
def user_code(tmp_path_factory):
    root = tmp_path_factory.mktemp("reload-check")
    (root / "reloadmodels.py").write_text(LAYERS)
    return root


def _one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"ampflow {command}: error: "), err
    return err


def test_check_model_refuses_a_layer_without_kwargs_in_one_line_naming_it(
        prepared_digits, user_code, capsys):
    from ampflow.cli import main

    code = main(["check-model", "--data-dir", str(prepared_digits), "--model",
                 "reloadmodels:no_kwargs", "--model-path", str(user_code)])
    err = _one_error_line(capsys, "check-model")
    assert code == 2, err
    assert "will not reload from its .keras file" in err
    assert re.search(r"layer 'no_kwargs(_\d+)?' \(NoKwargs\) has an __init__ without", err)
    assert "unexpected keyword argument" in err and "super().__init__(**kwargs)" in err


def test_train_refuses_it_before_the_first_step(prepared_digits, user_code, tmp_path, capsys,
                                               monkeypatch):
    from ampflow.cli import main
    from ampflow.components.train import step

    def no_training(*args, **kwargs):
        raise AssertionError("train reached its training loop with a model that cannot reload")

    monkeypatch.setattr(step, "_train", no_training)
    out = tmp_path / "model"
    code = main(["train", "--data-dir", str(prepared_digits), "--output-dir", str(out),
                 "--model", "reloadmodels:no_kwargs", "--model-path", str(user_code),
                 "--epochs", "1", "--precision", "float32"])
    err = _one_error_line(capsys, "train")
    assert code == 2, err
    assert re.search(r"layer 'no_kwargs(_\d+)?' \(NoKwargs\) has an __init__ without", err)
    assert not (out / "model.keras").exists()


def test_a_get_config_that_forgets_an_argument_is_named_with_its_fix(prepared_digits,
                                                                     user_code):
    from ampflow.components.train.preflight.check_model import CheckModelConfig, run_check_model

    with pytest.raises(ConfigError) as refused:
        run_check_model(CheckModelConfig(data_dir=prepared_digits,
                                         model="reloadmodels:forgets_an_argument",
                                         model_path=str(user_code)))
    text = str(refused.value)
    assert "layer 'scaled' (Scaled) has a get_config that does not return every __init__" in text
    assert "factor" in text and "\n" not in text


def test_a_layer_that_reloads_passes_and_leaves_no_file_behind(user_code, tmp_path, monkeypatch):
    import tempfile

    from ampflow.components.train.preflight.reload_check import check_reloads
    from ampflow.modeling.user_model import ModelSpec, import_user_module

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    module = import_user_module("reloadmodels", user_code)
    check_reloads(module.good((8, 8, 1), 3), ModelSpec("builder", "reloadmodels:good"),
                  user_code)
    assert list(tmp_path.iterdir()) == []  # the temporary .keras is gone
    with pytest.raises(ConfigError, match="NoKwargs"):
        check_reloads(module.no_kwargs((8, 8, 1), 3),
                      ModelSpec("builder", "reloadmodels:no_kwargs"), user_code)
    assert list(tmp_path.iterdir()) == []


def test_a_model_keras_cannot_rebuild_is_not_called_corrupt(user_code, tmp_path):
    # evaluate's loader said "could not be loaded (corrupt?)" for an intact archive whose
    # custom layer does not rebuild; corrupt is now said only of an unreadable archive
    import json

    from ampflow.artifacts.model_dir import REQUIRED_METADATA, load_trained_model
    from ampflow.errors import ModelLoadError
    from ampflow.modeling.user_model import import_user_module

    module = import_user_module("reloadmodels", user_code)
    module.no_kwargs((8, 8, 1), 3).save(tmp_path / "model.keras")
    metadata = {key: None for key in REQUIRED_METADATA}
    metadata["config"] = {"model_path": str(user_code)}
    (tmp_path / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(ModelLoadError) as refused:
        load_trained_model(tmp_path)
    text = str(refused.value)
    assert "corrupt" not in text and "is intact but Keras cannot rebuild" in text
    assert "unexpected keyword argument 'trainable'" in text and "check-model" in text
    assert "\n" not in text  # one line, the cause last (was ~15 lines of Keras config)
