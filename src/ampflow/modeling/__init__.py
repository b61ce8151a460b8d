"""Pretrained checkpoints as users download them, read exactly: the library beneath the steps.

- `safetensors`: the `.safetensors` format, read (and written) with NumPy alone;
- `hf_bert`: a Hugging Face BERT directory (config, weights, vocabulary, casing) as one frozen
  dataclass, every way it can be wrong one line naming the file;
- `bert`: a Keras 3 BERT encoder of exactly BERT's computation, with the AMP rules of the text
  models, and `load_hf_bert` that assigns every tensor of a checkpoint to it;
- `wordpiece` (+ `wordpiece_table`, its Unicode table): BERT's tokenizer in core TensorFlow
  ops, raw sentences to `token_ids`/`segment_ids`, in `tf.data` and in a SavedModel signature.

Nothing here imports a step: train, export and serve will reach a checkpoint through this
package (issue 48), the way the steps share code only through a library beneath them.
"""
