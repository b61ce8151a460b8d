"""`ampflow train`: a thin shell over `run_train`."""

from __future__ import annotations

from ampflow.cliutil import add_step_command


def _summary(result) -> dict:
    from ampflow.artifacts.throughput import throughput_unit

    meta = result.metadata
    dist = meta.get("distribution") or {}
    if dist.get("is_chief") is False:
        return {"role": f"{dist['task']['type']} {dist['task']['index']} of "
                        f"{dist['num_workers']}: trained; the chief publishes the model",
                "weights_sha256": meta.get("weights_sha256")}
    final = meta["final_metrics"]
    tokenizer = meta.get("tokenizer")
    text = {} if tokenizer is None else {"tokenizer": (
        f"{tokenizer['vocabulary_in_use']} words, {tokenizer['max_sequence_length']} tokens a "
        f"text ({tokenizer['source']})")}
    accumulation = meta.get("accumulation") or {}
    accumulated = {} if accumulation.get("accumulation_steps", 1) == 1 else {"accumulation": (
        f"{accumulation['accumulation_steps']} micro-batches of "
        f"{accumulation['micro_batch_size']} per replica and applied step (effective batch "
        f"{accumulation['effective_batch_size']})")}
    return {
        "model": meta["architecture"],
        **text,
        "policy": f"{meta['precision']['policy']} ({meta['precision']['reason']})",
        "xla": f"{meta['xla']['effective']} ({meta['xla']['reason']})",
        "val_accuracy": final.get("val_accuracy"),
        f"throughput_{throughput_unit(meta.get('modality')).kind}_s":
            meta["throughput_examples_per_sec"],
        "loss_scale": meta["loss_scale"].get("final", "n/a (no loss scaling)"),
        "skipped_steps": meta["loss_scale"].get("skipped_steps", 0),
        "strategy": f"{dist.get('strategy')} ({dist.get('num_workers')} worker(s), "
                    f"{dist.get('num_replicas')} replica(s), global batch "
                    f"{dist.get('global_batch_size')})",
        **accumulated,
        "model_dir": str(result.output_dir),
    }


def register(subparsers) -> None:
    """Add the `train` and `check-model` subcommands."""
    from ampflow.components.train.config import TrainConfig
    from ampflow.components.train.preflight.check_model import CheckModelConfig, run_check_model
    from ampflow.components.train.step import run_train

    add_step_command(
        subparsers,
        "train",
        config_cls=TrainConfig,
        run=run_train,
        summarize=_summary,
        help="Train a model with mixed precision (AMP) and XLA on a prepared dataset.",
    )
    add_step_command(
        subparsers,
        "check-model",
        config_cls=CheckModelConfig,
        run=run_check_model,
        summarize=lambda report: {"verdict": "ok" if report.ok else "refused",
                                  "policy": report.policy, "errors": len(report.errors),
                                  "warnings": len(report.warnings), "fixes": len(report.fixes)},
        help="Check a model's mixed-precision chain on a prepared dataset, without training.",
    )
