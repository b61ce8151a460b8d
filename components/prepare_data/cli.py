"""`ampflow prepare-data`: a thin shell over `run_prepare_data`.

`--image-size` comes from the config's `tuple[int, int] | None` field, which cliutil turns into
one flag of one or more integers (`--image-size 64` or `--image-size 64 48`);
`PrepareDataConfig` itself checks that there are one or two (`config.parse_image_size`).
"""

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
            "skipped_files": r.info["skipped_files"]["count"],
            "output_dir": str(r.output_dir),
        },
        help="Prepare a TFDS dataset, the offline default or a folder of images into a "
             "data dir.",
    )
