"""The unit a training rate is counted in: what one example of the data is.

One declaration for every place that prints a training throughput (the epoch progress line,
`ampflow train`'s summary, `--autotune`'s log lines, choice, report and metadata, and the
benchmark Markdown written from them): an image model's rate is images per second (`img/s`),
a text model's (the bert_* encoders) is texts, that is sequences, per second (`texts/s`). The
unit follows the data's modality (dataset_info.json's and metadata.json's `modality`), never a
string typed where the rate is printed, so a text model is never reported in images.

The JSON fields keep their names (`throughput_examples_per_sec`, autotune's `images_per_sec`,
which benchmarks/results already hold): they count examples of either kind, and the unit is a
field beside them (`throughput_unit`), not a rename.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampflow.data.modality import MODALITY_IMAGE, MODALITY_TEXT


@dataclass(frozen=True)
class ThroughputUnit:
    """How a rate of one kind of example is printed and named."""

    kind: str  # one example in names: `throughput_<kind>_s` (the train summary's row)
    item: str  # one example in a rate: "<n> <item>/s" (the progress line)
    plural: str  # examples counted in words: "2,525 texts" (the pipeline's result lines)

    @property
    def rate(self) -> str:
        """The unit as printed after a rate: `img/s`, `texts/s`."""
        return f"{self.item}/s"

    @property
    def metric(self) -> str:
        """The rate's metric name: `throughput_img_per_s` (KFP's metrics, the results table)."""
        return f"throughput_{self.item}_per_s"


UNITS = {MODALITY_IMAGE: ThroughputUnit("img", "img", "images"),
         MODALITY_TEXT: ThroughputUnit("text", "texts", "texts")}


def throughput_unit(modality: str | None) -> ThroughputUnit:
    """The unit of a model trained on `modality` data (None: image, as before text existed)."""
    return UNITS.get(modality or MODALITY_IMAGE, UNITS[MODALITY_IMAGE])
