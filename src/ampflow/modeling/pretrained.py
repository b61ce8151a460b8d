"""A pretrained BERT from a local directory in either layout users download, told apart.

- Hugging Face's (`huggingface-cli download`): `config.json` with `model_type: bert`, read by
  hf_bert.py;
- keras-hub's preset (Kaggle, `save_to_preset`): `config.json` with `registered_name:
  keras_hub>BertBackbone`, read by keras_hub_bert.py.
Both give one `HfBertCheckpoint`, so the encoder, its loading and the tokenizer are the same
code whichever layout came in. A handle (`hf://…`, `kaggle://…`) is not fetched: ampflow runs
where the network may not be, so it says in one line which command downloads it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ampflow.errors import ModelConfigError
from ampflow.modeling.hf_bert import CONFIG_FILE, HfBertCheckpoint, read_hf_bert
from ampflow.modeling.keras_hub_bert import is_keras_hub_preset, read_keras_hub_bert

# what downloads a handle, run where the network is; the directory it leaves is then given
DOWNLOADS = {
    "hf://": "huggingface-cli download {name} --local-dir DIR",
    "kaggle://": "python -c \"import kagglehub; print(kagglehub.model_download('{name}'))\"",
}


def read_pretrained_bert(source: str | os.PathLike) -> HfBertCheckpoint:
    """The checkpoint in the directory `source`, in whichever layout it was downloaded."""
    text = str(source)
    for scheme, command in DOWNLOADS.items():
        if text.startswith(scheme):
            raise ModelConfigError(
                f"Expected a local directory holding the checkpoint. Received: the handle "
                f"{text!r}, which ampflow does not download; run `"
                f"{command.format(name=text.removeprefix(scheme))}` where the network is and "
                "give DIR")
    directory = Path(source)
    if not directory.is_dir():
        raise ModelConfigError(
            f"Expected a directory holding a BERT checkpoint (Hugging Face's layout or a "
            f"keras-hub preset). Received: {directory} is not a directory")
    if not (directory / CONFIG_FILE).exists():
        raise ModelConfigError(
            f"{directory / CONFIG_FILE}: expected config.json, Hugging Face's (model_type "
            "bert) or a keras-hub preset's (keras_hub>BertBackbone). Received: no such file; "
            "download the whole repository or preset")
    if is_keras_hub_preset(directory):
        return read_keras_hub_bert(directory)
    return read_hf_bert(directory)


def load_pretrained_bert(source: str | os.PathLike):
    """`(encoder, checkpoint)`: `bert.bert_encoder` with every tensor of the checkpoint assigned."""
    from ampflow.modeling.bert import assign_hf_weights, bert_encoder

    checkpoint = read_pretrained_bert(source)
    encoder = bert_encoder(checkpoint.config, pad_id=checkpoint.pad_id)
    assign_hf_weights(encoder, checkpoint)
    return encoder, checkpoint
