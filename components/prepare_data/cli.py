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


# A summary names a dataset_info.json key by the flag that sets it.
_FLAG_NAMES = {"text_key": "text_feature"}


def _summary(result) -> dict:
    """What the command prints: the dataset, its splits and shape (or text feature), skips."""
    from ampflow.components.prepare_data.modalities import preparing_of

    info = result.info
    shape = preparing_of(info["modality"]).shape(info)
    shape = {_FLAG_NAMES.get(key, key): value for key, value in shape.items()}
    return {
        "dataset": f"{info['name']} {info['version']}",
        "splits": info["splits"],
        **shape,
        "classes": info["num_classes"],
        "skipped_files": info["skipped_files"]["count"],
        "output_dir": str(result.output_dir),
    }
