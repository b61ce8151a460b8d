"""A --weights run's phases (components/train/run/phases.py), its flags and where it resumes.

No TensorFlow model here: the plan from the flags, the checks of the flags, the state dirs the
phases checkpoint in, and the input iterator the phases share. The training itself:
tests/components/train/test_imagenet_weights_train.py and the end-to-end runs.
"""

from __future__ import annotations

import pytest

from ampflow.components.train.config import TrainConfig
from ampflow.components.train.run.checkpoints import BatchFeed
from ampflow.components.train.run.phases import (
    Phase,
    phase_state_dir,
    plan_phases,
    resumable,
)
from ampflow.errors import ConfigError
from ampflow.modeling.imagenet_weights import WEIGHTS_MODELS
from ampflow.modeling.transfer import TransferRecipe

# The built-in that takes --weights (a constant: nothing here builds it)
BACKBONE = "resnet50"


def _config(**overrides) -> TrainConfig:
    return TrainConfig(data_dir="d", output_dir="o", **overrides)


def test_a_run_without_weights_is_one_phase_at_its_learning_rate():
    assert plan_phases(_config(epochs=3), 0.01) == (Phase("all", 0, 3, 0.01),)


def test_weights_split_epochs_into_the_head_then_the_fine_tuning_at_the_recipes_rates():
    recipe = TransferRecipe()
    config = _config(model=BACKBONE, weights="w.h5", epochs=8)
    assert config.learning_rate == recipe.fine_tune_learning_rate  # --learning-rate's default
    assert plan_phases(config, config.learning_rate) == (
        Phase("head", 0, recipe.head_epochs, recipe.head_learning_rate, frozen=True),
        Phase("fine_tune", recipe.head_epochs, 8, recipe.fine_tune_learning_rate))
    # --scale-learning-rate's factor (here 4 replicas) scales both phases
    assert [p.learning_rate for p in plan_phases(config, 4 * config.learning_rate)] == [
        4 * recipe.head_learning_rate, 4 * recipe.fine_tune_learning_rate]


@pytest.mark.parametrize(("head_epochs", "names"), [(0, ["fine_tune"]), (3, ["head"])])
def test_a_phase_of_no_epochs_is_left_out(head_epochs, names):
    config = _config(model=BACKBONE, weights="w.h5", epochs=3, head_epochs=head_epochs)
    assert [p.name for p in plan_phases(config, config.learning_rate)] == names


@pytest.mark.parametrize(("overrides", "says"), [
    ({"model": BACKBONE, "weights": "w.h5", "epochs": 2}, r"head_epochs must be <= epochs \(2\)"),
    ({"head_epochs": 1}, "head_epochs sets the transfer recipe of a --weights run"),
    ({"head_learning_rate": 0.1}, "head_learning_rate sets the transfer recipe"),
    ({"model": BACKBONE, "weights": "w.h5", "head_learning_rate": 0.0},
     "head_learning_rate must be > 0"),
    ({"model": "small_cnn", "weights": "w.h5"}, f"model must be {' or '.join(WEIGHTS_MODELS)}"),
])
def test_the_transfer_flags_are_checked_in_one_line(overrides, says):
    with pytest.raises(ConfigError, match=says):
        _config(**overrides)


def test_each_phase_checkpoints_in_its_own_dir_and_a_run_resumes_in_the_latest(tmp_path):
    config = _config(model=BACKBONE, weights="w.h5", epochs=4, head_epochs=2)
    phases = plan_phases(config, config.learning_rate)
    state = str(tmp_path)
    head, fine = (phase_state_dir(state, phases, i) for i in range(2))
    assert fine == state  # the last phase where any run checkpoints: resumable as before
    assert head == f"{state}/backup/head"  # removed with backup/ once the model is published
    assert not resumable(state, phases)
    (tmp_path / "backup" / "head" / "backup").mkdir(parents=True)
    (tmp_path / "backup" / "head" / "backup" / "ckpt-3.index").write_bytes(b"")
    assert resumable(state, phases)  # a run killed in phase 1 keeps its epoch log


def test_phases_read_one_iterator_on_and_a_resume_skips_only_what_was_not_read():
    feed = BatchFeed(iter(range(100)))
    feed.skip_to(3)  # phase 1 resumed at step 3
    assert [next(feed.iterator), next(feed.iterator)] == [3, 4]  # its steps 3 and 4
    feed.position = 5  # as the loop records it
    feed.skip_to(5)  # phase 2 starts there: nothing skipped
    assert next(feed.iterator) == 5
