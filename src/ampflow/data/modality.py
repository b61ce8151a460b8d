"""The text data contract: what a prepared text dataset holds, and how a later step reads it.

Every text source `prepare-data` takes (a TFDS catalog dataset, `--text-folder`, `--text-file`,
the offline `ampflow_rotten_tomatoes`) ends as one kind of prepared dir (docs/ARTIFACTS.md):

- `dataset_info.json` says `"modality": "text"`, `"text_key"` (the TFDS feature holding the
  text: `text` for ampflow's own builders, the dataset's own name for a catalog one, e.g.
  `sentence` for glue/sst2), `"label_key"` (a `ClassLabel`), `"class_names"` and
  `"skipped_files"` (every file or row that was left out, and why);
- `text_input.load_text_split(dir, split)` gives `(text, label)` examples: a scalar `tf.string`
  (UTF-8, as written: no lower-casing, no stripping; tokenization belongs to the model) and an
  `int64` class id, with the held-out split applied, whatever the source named its features.

The names below are the ones the train, export and serve steps share (the serving signature's
input is `TEXT_FEATURE`). A leaf module, free of TensorFlow: the CLI's parser imports it.
"""

from __future__ import annotations

from typing import Any

# The feature names of ampflow's own text builders, and the name later steps give the text
# (the serving signature's input, the `tf.Example` feature of `classify`).
TEXT_FEATURE = "text"
LABEL_FEATURE = "label"
# The names a TFDS dataset's text feature most often has, most likely first: the choice when
# it has several string features (ag_news_subset: title and description).
TEXT_FEATURE_NAMES = ("text", "sentence", "content", "description", "review", "document")
# dataset_info.json["modality"]: what the examples hold.
MODALITY_IMAGE = "image"
MODALITY_TEXT = "text"
# The largest text (one file, one table cell) a folder or table may hold, in UTF-8 bytes; a
# larger one is skipped and listed. The longest IMDb review is about 14 kB, and a model reads
# at most its sequence length (hundreds of tokens) of it: a larger file is a log, a dump or a
# book, not an example.
DEFAULT_MAX_TEXT_BYTES = 100_000
# The table formats --text-file reads, by file extension.
TABLE_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}
# Why a file or row was left out: the keys of dataset_info.json's `skipped_files.by_reason`
# (each skipped item's `reason`; its `detail` says more).
SKIP_NOT_UTF8 = "not UTF-8"
SKIP_EMPTY = "empty"
SKIP_TOO_LARGE = "larger than max_text_bytes"
SKIP_NO_LABEL = "no label"
SKIP_MALFORMED = "malformed row"
SKIP_NOT_TXT = "not a .txt file"
SKIP_OUTSIDE = "not inside a class folder"
SKIP_UNREADABLE = "unreadable"
SKIP_REASONS = (SKIP_NOT_UTF8, SKIP_EMPTY, SKIP_TOO_LARGE, SKIP_NO_LABEL, SKIP_MALFORMED,
                SKIP_NOT_TXT, SKIP_OUTSIDE, SKIP_UNREADABLE)
# At most this many skipped items are listed one by one (the counts are always complete).
MAX_LISTED_SKIPS = 1000


def is_text(info: dict[str, Any]) -> bool:
    """Whether a prepared dataset (its dataset_info.json) holds text."""
    return info.get("modality") == MODALITY_TEXT
