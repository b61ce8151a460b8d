"""`ampflow prepare-data`: a thin shell over `run_prepare_data`."""

from __future__ import annotations

from ampflow.cliutil import add_step_command


def register(subparsers) -> None:
    """Add the `prepare-data` subcommand."""
    from ampflow.components.prepare_data.step import PrepareDataConfig, run_prepare_data

    add_step_command(
        subparsers,
        "prepare-data",
        config_cls=PrepareDataConfig,
        run=run_prepare_data,
        summarize=lambda r: {
            "dataset": f"{r.info['name']} {r.info['version']}",
            "splits": r.info["splits"],
            "image_shape": r.info["image_shape"],
            "classes": r.info["num_classes"],
            "output_dir": str(r.output_dir),
        },
        help="Prepare a TFDS dataset (or the offline default) into a data dir.",
    )
