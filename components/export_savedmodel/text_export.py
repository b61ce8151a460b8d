"""The text model's export: what happens inside the staging dir for a model that reads text.

The sibling of image_export.py, chosen by modalities.py from the trained model's modality
(metadata.json's `modality`, checked against dataset_info.json's). The same order of work: the
SavedModel (text_signatures.py: the tokenizer in the graph), its signatures checked against the
contract, its graph scanned for half precision and for any op that is not core TensorFlow,
warm-up records of real test sentences written and replayed, the parity check of raw text
against token ids (text_parity.py), and the canary answers recorded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.artifacts.canary_examples import write_text_canary_examples
from ampflow.artifacts.signature_names import TEXT_INPUT, TOKEN_IDS_INPUT, TOKEN_IDS_SIGNATURE
from ampflow.components.export_savedmodel.signatures import LABELS_FILE, half_precision_nodes
from ampflow.components.export_savedmodel.text_parity import check_text_export_parity
from ampflow.components.export_savedmodel.text_signatures import (
    check_text_signatures,
    graph_op_types,
    length_buckets_of,
    non_core_ops,
    save_text_servable,
    text_example,
)
from ampflow.components.export_savedmodel.warmup import replay_warmup_records
from ampflow.errors import ConfigError, ExportError
from ampflow.serving.model_format import (
    DEFAULT_SIGNATURE,
    MAX_WARMUP_RECORDS,
    classify_log,
    predict_log,
    write_warmup_file,
)

log = logging.getLogger(__name__)


@dataclass
class TextExport:
    """A text model's export: its tokenizer (from the model dir) and real test sentences."""

    tokenizer: Any  # ampflow.modeling.tokenizer.TextTokenizer: the one the model was trained with
    texts: list[str]  # real test sentences: warm-up, parity and canary examples
    labels: list[str]
    op_types: list[str] = field(default_factory=list)  # of the written graph, all core
    length_buckets: list[int] | None = None  # what a text request is padded to; None: the cap

    @property
    def sequence_length(self) -> int:
        return self.tokenizer.sequence_length

    def write_and_check(self, twin, trained, staging: Path, model_name: str, config):
        """Everything inside the staging dir; any failure leaves no version behind."""
        import tensorflow as tf

        save_text_servable(twin, graph_tokenizer(self.tokenizer), self.labels, staging)
        self.length_buckets = length_buckets_of(twin, self.sequence_length)
        signatures = check_text_signatures(staging, self.sequence_length, len(self.labels))
        half = half_precision_nodes(staging)
        if half:
            raise ExportError(f"the exported graph must hold no float16/bfloat16 tensors. "
                              f"Received: {len(half)} nodes, e.g. {half[:3]}")
        ops = graph_op_types(staging)
        foreign = non_core_ops(ops)
        if foreign:
            raise ExportError(f"the exported graph must run core TensorFlow ops only (TF "
                              f"Serving links no custom op library). Received: {foreign}")
        self._check_shipped_vocabulary(staging)
        warmup_count = write_text_warmup_records(staging, model_name, self.texts,
                                                 config.num_warmup_records, self.tokenizer)
        try:
            loaded = tf.saved_model.load(str(staging))
        except Exception as e:
            raise ExportError(f"the written SavedModel does not load back: {e}") from e
        replay_warmup_records(staging, loaded)
        parity = check_text_export_parity(
            loaded, twin, trained, self.tokenizer, self.texts[:config.num_parity_images],
            self.labels, atol=config.parity_atol, rtol=config.parity_rtol)
        write_text_canary_examples(staging, loaded, self.texts[:config.num_canary_examples])
        self.op_types = sorted(ops)
        return signatures, parity, warmup_count

    def _check_shipped_vocabulary(self, staging: Path) -> None:
        """assets/vocab.txt + tokenizer.json must rebuild the model's own tokenizer."""
        from ampflow.modeling.tokenizer import load_tokenizer

        try:
            shipped = load_tokenizer(staging / "assets")
        except ConfigError as e:
            raise ExportError(f"the shipped vocabulary does not read back: {e}") from e
        if (shipped.vocabulary != self.tokenizer.vocabulary
                or shipped.config != self.tokenizer.config):
            raise ExportError("assets/vocab.txt and tokenizer.json must be the vocabulary the "
                              "model was trained with. Received: a different vocabulary or "
                              "settings")

    def input_metadata(self) -> dict[str, Any]:
        """ampflow_export.json's input blocks for a text model."""
        from ampflow.modeling.tokenizer import TOKENIZER_FILE, VOCAB_FILE

        config = self.tokenizer.config
        return {
            "modality": "text",
            "input": {"name": TEXT_INPUT, "shape": [-1], "dtype": "string",
                      "note": "one raw UTF-8 text per element, tokenized in the graph "
                              "(keras TextVectorization, core TensorFlow ops)",
                      "padded_to": (f"the request's longest text, rounded up to one of "
                                    f"{self.length_buckets} tokens" if self.length_buckets
                                    else f"{self.sequence_length} tokens"),
                      # the server bounds a request's tokens with them (ampflow serve)
                      "length_buckets": self.length_buckets},
            "token_ids_input": {"signature": TOKEN_IDS_SIGNATURE, "name": TOKEN_IDS_INPUT,
                                "shape": [-1, self.sequence_length], "dtype": "int32",
                                "note": "token ids of assets/vocab.txt, 0 = padding; what "
                                        "the TFLite variants take (at this fixed length)"},
            "tokenizer": {"max_sequence_length": config.max_sequence_length,
                          "vocabulary_size": config.vocabulary_size,
                          "vocabulary_in_use": self.tokenizer.vocabulary_size,
                          "files": [f"assets/{VOCAB_FILE}", f"assets/{TOKENIZER_FILE}"]},
            "labels_file": f"assets/{LABELS_FILE}",
            "graph_ops": {"count": len(self.op_types), "all_core_tensorflow": True,
                          "types": self.op_types},
        }


def graph_tokenizer(tokenizer):
    """The tokenizer the served graph runs: the model's own (a seam the parity test replaces)."""
    return tokenizer


def text_export_of(tokenizer, data_dir: Path, meta: dict, info: dict, labels: list[str],
                   count: int) -> TextExport:
    """The text export's inputs: a tokenizer of the model's sequence length, real test texts."""
    from ampflow.data import load_texts

    length = meta["input_shape"][0] if meta.get("input_shape") else None
    if length is not None and int(length) != tokenizer.sequence_length:
        raise ExportError(f"the model takes {length} token ids but its tokenizer makes "
                          f"{tokenizer.sequence_length} (tokenizer.json beside model.keras)")
    texts, _ = load_texts(data_dir, "test", limit=count)
    if not texts:
        raise ConfigError(f"data_dir's test split must hold at least one text (warm-up and "
                          f"parity run on real test sentences). Received: none in {data_dir}")
    return TextExport(tokenizer=tokenizer, texts=list(texts), labels=labels)


# ---- warm-up ------------------------------------------------------------------------------

def write_text_warmup_records(version_dir: Path, model_name: str, texts: list[str],
                              num_predict: int, tokenizer) -> int:
    """Write the warm-up requests of real test sentences; return how many.

    `num_predict` Predict requests of one sentence each (`text`, cycling), one `token_ids`
    request (the first sentence's ids) and one Classify request (a tf.Example of it). TF
    Serving replays them at load (model_format's WARMUP_FILE); 0 writes no file.
    """
    if not 0 <= num_predict <= MAX_WARMUP_RECORDS - 2:
        raise ConfigError(f"num_predict must be in [0, {MAX_WARMUP_RECORDS - 2}]. Received: "
                          f"num_predict={num_predict}")
    if num_predict == 0:
        return 0
    first_ids = np.asarray(tokenizer.tokenize(np.asarray(texts[:1], dtype=object)), np.int32)
    records = [predict_log(model_name, DEFAULT_SIGNATURE, TEXT_INPUT,
                           np.array([texts[i % len(texts)].encode("utf-8")], dtype=object))
               for i in range(num_predict)]
    records.append(predict_log(model_name, TOKEN_IDS_SIGNATURE, TOKEN_IDS_INPUT, first_ids))
    records.append(classify_log(model_name, [text_example(t) for t in texts[:1]]))
    return write_warmup_file(version_dir, records)
