"""`ampflow export`: a thin shell over `run_export`."""

from __future__ import annotations

from ampflow.cliutil import add_step_command


def _summary(result) -> dict:
    meta = result.metadata
    parity = meta["parity"]
    return {
        "model": f"{result.model_name} version {result.version}",
        "version_dir": str(result.version_dir),
        "trained_policy": f"{meta['source']['trained_policy']} (exported as float32)",
        "export_parity": f"max |SavedModel - Keras| = {parity['max_abs_diff']:.3g} on "
                         f"{_checked_examples(meta)}",
        "warmup_records": meta["warmup"]["records"],
        "gate": "FORCED: " + meta["gate"]["warning"] if result.forced else "passed",
        "serve_with": f"tensorflow_model_server --model_name={result.model_name} "
                      f"--model_base_path={result.model_base.resolve()}",
    }


def _checked_examples(meta: dict) -> str:
    """`64 images` or `90 texts`: what the parity check ran on, in the data's own unit.

    The parity block counts `num_images` or `num_texts` (parity.py, text_parity.py); the unit's
    word is throughput.py's, the one declaration of an example's name by modality.
    """
    from ampflow.artifacts.throughput import throughput_unit

    plural = throughput_unit(meta.get("modality")).plural
    return f"{meta['parity'][f'num_{plural}']} {plural}"


def register(subparsers) -> None:
    """Add the `export` subcommand."""
    from ampflow.components.export_savedmodel.step import ExportConfig, run_export

    add_step_command(
        subparsers,
        "export",
        config_cls=ExportConfig,
        run=run_export,
        summarize=_summary,
        help="Export the float32 twin of a trained model as a versioned SavedModel for TF "
             "Serving (gated on the parity verdict).",
    )
