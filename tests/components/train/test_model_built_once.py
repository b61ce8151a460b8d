"""`train` builds its model once: the model the AMP check built and checked is the one it trains.

The pre-training AMP check (step.preflight_model) used to build a model of its own, and `_train`
a second one: a ResNet-50 paid its ~4.8 CPU-s build twice. Now, under the default strategy,
the check's model is built under the run's seed and trained, with the same initial weights a
second build had (so a run's results stay bit-identical for a seed).
"""

import json
import zipfile

import pytest

from ampflow.components.train import TrainConfig, run_train
from ampflow.components.train.preflight import rules as amp_check
from ampflow.data import load_dataset_info
from ampflow.modeling import models


@pytest.mark.slow
def test_train_builds_its_model_once_and_trains_the_checked_model(tmp_path, prepared_digits,
                                                                   monkeypatch):
    import keras

    built, initial = [], []
    make_model = models.make_model
    check_built = amp_check.check_built

    def counting_make_model(*args, **kwargs):
        built.append(make_model(*args, **kwargs))
        return built[-1]

    def weights_when_checked(model, *args, **kwargs):
        initial.append([w.copy() for w in model.model.get_weights()])
        return check_built(model, *args, **kwargs)

    monkeypatch.setattr(models, "make_model", counting_make_model)
    monkeypatch.setattr(amp_check, "check_built", weights_when_checked)
    result = run_train(TrainConfig(
        data_dir=prepared_digits, output_dir=tmp_path / "model", model="small_cnn",
        precision="float32", epochs=1, steps_per_epoch=1, batch_size=8, seed=3))

    assert len(built) == 1  # the check's build; training built no second model
    # the published model is the checked one: the layer names of the metadata (read from the
    # checked model) are those of the trained archive, auto-numbered names included
    with zipfile.ZipFile(result.output_dir / "model.keras") as archive:
        saved = json.loads(archive.read("config.json"))["config"]["layers"]
    checked_names = {row["name"] for row in result.metadata["model"]["layer_dtypes"]}
    assert {layer["config"]["name"] for layer in saved} - {"images"} == checked_names
    # its initial weights are those of a model built right after seeding, as before
    keras.utils.set_random_seed(3)
    info = load_dataset_info(prepared_digits)
    fresh = make_model("small_cnn", info["image_shape"], info["num_classes"]).model.get_weights()
    assert len(initial) == 1 and len(fresh) == len(initial[0])
    assert all((a == b).all() for a, b in zip(fresh, initial[0], strict=True))
