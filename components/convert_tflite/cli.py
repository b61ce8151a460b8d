"""`ampflow convert`: a thin shell over `run_convert`."""

from __future__ import annotations

from ampflow.cliutil import add_step_command


def register(subparsers) -> None:
    """Add the `convert` subcommand."""
    from ampflow.components.convert_tflite.step import ConvertConfig, run_convert

    add_step_command(
        subparsers,
        "convert",
        config_cls=ConvertConfig,
        run=run_convert,
        summarize=_summary,
        help="Convert an exported SavedModel to TFLite variants, check each against the "
        "SavedModel on the test split and gate them.",
    )


def _summary(result) -> dict:
    rows = {"output_dir": str(result.output_dir), "report": str(result.report_md)}
    for name, v in result.variants.items():
        t = v.metrics["timing"]
        rows[name] = (f"{v.size_bytes / 1024:.1f} KiB, acc {v.metrics['accuracy']:.4f}, "
                      f"agreement {v.metrics['agreement']:.4f}, p50 {t['latency_ms_median']:.3f} "
                      f"ms, {'pass' if v.passed else 'FAIL'}")
    return rows
