"""A text model's SavedModel and TFLite names, beside the image ones in `serving.model_format`.

Export writes them, evaluate's serving check and convert's token-id variants read them, so they
live beneath all three.
"""

from ampflow.data.modality import TEXT_FEATURE

TEXT_INPUT = TEXT_FEATURE  # serving_default's input: string [-1], one raw text per element
TOKEN_IDS_SIGNATURE = "token_ids"  # the signature on token ids (parity, TFLite)
TOKEN_IDS_INPUT = "input_ids"  # int32 [-1, L], 0 = padding
