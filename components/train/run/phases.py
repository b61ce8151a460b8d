"""A run's phases: one for most runs; with --weights, the transfer recipe's two.

Phase 1 trains the new head on the frozen pretrained backbone (`trainable = False`: no
gradient reaches it, and its BatchNormalization runs in inference mode on the ImageNet
statistics, which do not move) at --head-learning-rate; phase 2 unfreezes every layer and
fine-tunes at the low --learning-rate (ampflow.modeling.transfer says why). Each phase is the
one training loop (loop.py) over its epochs of --epochs, with an optimizer of its own:
trainable variables are fixed when a model is compiled, and Keras's LossScaleOptimizer (its
scale, its step counter) is rebuilt with it. The phases read one input iterator in turn, so the
batches are those of one loop. Checkpoints: phase 2's in the state dir's backup/ as for any run,
an earlier phase's under backup/<phase>/; a resumed run restarts in the latest phase that has one
(restoring phase 1's last checkpoint when phase 2 has none yet).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from ampflow.components.train.run import checkpoints
from ampflow.components.train.run.loop import LoopResult, TrainLoop, backup_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Phase:
    """Epochs [first_epoch, last_epoch) of the run at one learning rate, backbone frozen or not."""

    name: str
    first_epoch: int
    last_epoch: int
    learning_rate: float
    frozen: bool = False

    def to_json(self) -> dict:
        """The phase as metadata.json's `recipe.phases` holds it."""
        return {**dataclasses.asdict(self), "epochs": self.last_epoch - self.first_epoch}


def plan_phases(config, learning_rate: float) -> tuple[Phase, ...]:
    """The run's phases: `learning_rate` is --learning-rate as it runs (scaled by replicas)."""
    if not config.weights:
        return (Phase("all", 0, config.epochs, learning_rate),)
    recipe = config.transfer_recipe()
    scale = learning_rate / config.learning_rate  # --scale-learning-rate's factor, if any
    phases = (Phase("head", 0, recipe.head_epochs, recipe.head_learning_rate * scale, True),
              Phase("fine_tune", recipe.head_epochs, config.epochs, learning_rate))
    return tuple(phase for phase in phases if phase.last_epoch > phase.first_epoch)


def phase_state_dir(state_dir: str, phases: tuple[Phase, ...], index: int) -> str:
    """Where phase `index` keeps its checkpoints: the last phase in the run's own place."""
    if index == len(phases) - 1:
        return state_dir
    return backup_dir(state_dir) + "/" + phases[index].name


def resumable(state_dir: str, phases: tuple[Phase, ...]) -> bool:
    """Whether any phase left a checkpoint to resume from."""
    return any(checkpoints.checkpoint_paths(backup_dir(phase_state_dir(state_dir, phases, i)))
               for i in range(len(phases)))


def run_phases(model, phases: tuple[Phase, ...], loop_config, runtime, compile_phase,
               data: tuple, callbacks: list) -> tuple[TrainLoop, LoopResult]:
    """Train `model` phase after phase; the last phase's loop and the whole run's result.

    `compile_phase(phase)` compiles the model with the phase's optimizer (a run of one phase
    is compiled already); `data` is the (train, test) pair of distributed datasets.
    """
    if len(phases) == 1 and not phases[0].frozen:
        loop = TrainLoop(runtime, model, loop_config)
        return loop, loop.fit(*data, callbacks)
    from ampflow.modeling.imagenet_weights import backbone_of
    from ampflow.modeling.transfer import set_frozen

    backbone = backbone_of(model)
    first = _resume_index(loop_config.state_dir, phases)
    result, feed, applied, loop = LoopResult(), None, 0, None
    for index in range(first, len(phases)):
        phase = phases[index]
        set_frozen(backbone, phase.frozen)
        compile_phase(phase)
        earlier, loop = loop, TrainLoop(runtime, model, dataclasses.replace(
            loop_config, state_dir=phase_state_dir(loop_config.state_dir, phases, index),
            first_epoch=phase.first_epoch, last_epoch=phase.last_epoch,
            iterations_offset=applied))
        if earlier is not None:
            loop.evaluate_with(earlier)
        if runtime.is_chief:
            log.info("phase %s: epochs %d-%d, %s, learning rate %g (%d of %d variables "
                     "trainable)", phase.name, phase.first_epoch + 1, phase.last_epoch,
                     "backbone frozen" if phase.frozen else "every layer trainable",
                     phase.learning_rate, len(model.trainable_variables), len(model.variables))
        done = loop.fit(*data, callbacks, feed=feed, begin=index == first,
                        end=index == len(phases) - 1)
        feed, applied = loop.feed, loop.applied_steps()
        result.epochs += done.epochs
        result.train_seconds += done.train_seconds
        result.resumed_at_step = result.resumed_at_step or done.resumed_at_step
    set_frozen(backbone, False)  # the published model fine-tunes on as any other
    return loop, result


def _resume_index(state_dir: str, phases: tuple[Phase, ...]) -> int:
    """The latest phase with a checkpoint (0 when none has one)."""
    for index in reversed(range(len(phases))):
        if checkpoints.checkpoint_paths(backup_dir(phase_state_dir(state_dir, phases, index))):
            return index
    return 0
