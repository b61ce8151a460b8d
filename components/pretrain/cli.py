"""`ampflow pretrain`: a thin shell over `run_pretrain`."""

from __future__ import annotations

from ampflow.cliutil import add_step_command


def _summary(result) -> dict:
    report = result.report
    losses = report["masked_lm_loss_per_epoch"]
    return {"texts": report["texts"], "vocabulary": report["vocabulary_size"],
            "steps_per_epoch": report["steps_per_epoch"],
            "masked_lm_loss": f"{losses[0]} (epoch 1) -> {losses[-1]} (epoch {len(losses)})",
            "seconds": report["seconds"], "checkpoint": str(result.output_dir),
            "next": f"ampflow train --model {result.output_dir} --data-dir ..."}


def register(subparsers) -> None:
    """Add the `pretrain` subcommand."""
    from ampflow.components.pretrain.config import PretrainStepConfig
    from ampflow.components.pretrain.step import run_pretrain

    add_step_command(
        subparsers, "pretrain", config_cls=PretrainStepConfig, run=run_pretrain,
        summarize=_summary,
        help="Pretrain a BERT encoder (masked LM) on a prepared text dataset's training texts.",
        description="Pretrain a BERT encoder with BERT's masked-language-model objective on the "
                    "training split's texts of a prepared text dataset (labels unused), and "
                    "write it in the Hugging Face layout, for `ampflow train --model DIR`.")
