"""The modeling library beneath the steps: every model train builds and later steps rebuild.

- the built-in models by name (`models`, `text_models`), a user's builder or `.keras` file
  (`user_model`: the standard head, the policy scope), the custom `layers` and `text_layers`,
  the float32 head (`heads`), the text tokenizer (`tokenizer`), the float32 twin (`twin`);
- pretrained checkpoints as users download them, read exactly: `safetensors`, `hf_bert` (a
  Hugging Face BERT directory), `bert` (a Keras BERT encoder of BERT's computation and
  `load_hf_bert`), `wordpiece` (+ `wordpiece_table`: BERT's tokenizer in core TensorFlow ops).

Nothing here imports a step: train, evaluate, export and convert share models only through it.
"""
