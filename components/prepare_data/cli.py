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
        summarize=_summary,
        help="Prepare a TFDS dataset (images or text), an offline one, a folder of images or "
             "texts, or a table of texts into a data dir.",
    )


def _summary(result) -> dict:
    """What the command prints: the dataset, its splits and shape (or text feature), skips."""
    info = result.info
    shape = ({"text_feature": info["text_key"]} if info.get("modality") == "text"
             else {"image_shape": info["image_shape"]})
    return {
        "dataset": f"{info['name']} {info['version']}",
        "splits": info["splits"],
        **shape,
        "classes": info["num_classes"],
        "skipped_files": info["skipped_files"]["count"],
        "output_dir": str(result.output_dir),
    }
