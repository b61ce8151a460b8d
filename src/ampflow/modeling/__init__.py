"""The modeling library beneath the steps: every model train builds and later steps rebuild.

- the built-in models by name (`models`, `text_models`), a user's builder or `.keras` file
  (`user_model`: the standard head, the policy scope), the custom `layers` and `text_layers`,
  the float32 head (`heads`), the text tokenizer (`tokenizer`), the float32 twin (`twin`);
- pretrained checkpoints as users download them, read exactly: `safetensors`, `hf_bert` (a
  Hugging Face BERT directory), `keras_hub_bert` (keras-hub's preset layout), `pretrained`
  (either layout, told apart), `bert` (a Keras BERT encoder of BERT's computation),
  `wordpiece` (+ `wordpiece_table`: BERT's tokenizer in core TensorFlow ops), `classifier`
  and `fine_tuning` (the head on [CLS], BERT's optimizer), `imagenet_weights` and `transfer`
  (Keras applications' weights files, the frozen-then-unfrozen recipe);
- checkpoints made here: `hf_bert_writer` (the Hugging Face layout written, beside its reader),
  `wordpiece_vocab` (a WordPiece vocabulary from a split's texts), `mlm` (BERT's masking rule
  and prediction head) and `pretrain` (masked-LM pretraining, or an encoder at its start).

Nothing here imports a step: train, evaluate, export and convert share models only through it.
"""
