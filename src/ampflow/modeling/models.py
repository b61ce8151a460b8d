"""Models by name: image models take RAW pixels, text models int32 token ids; all end in float32.

Rescaling (and resizing for the ImageNet architectures) is the model's first layer, so the
served model takes what a client sends. The text models (`bert_tiny` … `bert_base`,
text_models.py) take the ids of src/ampflow/modeling/tokenizer.py, 0 = padding. The `logits` Dense
layer and the `probabilities` softmax are pinned to float32 whatever the global policy:
softmax/cross-entropy in float16 overflows and loses the small probabilities the loss needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ampflow.modeling.heads import float32_head
from ampflow.modeling.text_models import BERT_SHAPES, bert_builder

# Set the Keras global dtype policy for a block (one home: user_model.py, which rebuilds under it)
from ampflow.modeling.user_model import policy_scope
from ampflow.serving.model_format import IMAGES_INPUT  # the served signature's input name

ModelBuilder = Callable[[tuple[int, int, int], int, "int | None"], Any]
# build(sequence_length, vocabulary_size, num_classes): the user text builder's contract too
TextModelBuilder = Callable[[int, int, int], Any]
_REGISTRY: dict[str, ModelBuilder] = {}
_TEXT_REGISTRY: dict[str, TextModelBuilder] = {}
# keras.applications refuse inputs below 32×32; the digits are 8×8, so these resize inside.
_DEFAULT_IMAGE_SIZE = {"resnet50": 32, "mobilenet_v2": 32}


def register_model(name: str, builder: ModelBuilder) -> None:
    """Make `builder(input_shape, num_classes, image_size) -> keras.Model` trainable by name."""
    _REGISTRY[name] = builder


def register_text_model(name: str, builder: TextModelBuilder) -> None:
    """Make `builder(sequence_length, vocabulary_size, num_classes) -> keras.Model` a text model.

    Built by name through `make_text_model`.
    """
    _TEXT_REGISTRY[name] = builder


def model_names() -> tuple[str, ...]:
    """Every built-in name `--model` accepts, image and text (besides builders and .keras files).

    The one list `parse_model_spec` classifies against.
    """
    return tuple(sorted({*_REGISTRY, *_TEXT_REGISTRY}))


def image_model_names() -> tuple[str, ...]:
    """Built-in image models (`make_model`)."""
    return tuple(sorted(_REGISTRY))


def text_model_names() -> tuple[str, ...]:
    """Built-in text models (`make_text_model`)."""
    return tuple(sorted(_TEXT_REGISTRY))


@dataclass(frozen=True)
class BuiltModel:
    """A model ready to train, and what ampflow changed to make it so (for the log and report)."""

    model: Any
    spec: Any  # user_model.ModelSpec
    fixes: tuple[str, ...] = ()
    original: Any = None  # the model before its float32 head: what the AMP check names

    def __post_init__(self) -> None:
        if self.original is None:
            object.__setattr__(self, "original", self.model)


def build_model(
    name: str,
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    image_size: int | None = None,
    policy: str | None = None,
    model_path: str | None = None,
):
    """Build model `name` (built-in, builder or .keras file: user_model.py) under `policy`."""
    return make_model(name, input_shape, num_classes, image_size=image_size, policy=policy,
                      model_path=model_path).model


def make_model(
    name: str,
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    image_size: int | None = None,
    policy: str | None = None,
    model_path: str | None = None,
) -> BuiltModel:
    """`build_model`, also saying what was fixed (the float32 head, a policy rebuild).

    `policy` None means the current Keras global policy (set by configure_precision). The
    global policy is restored afterwards. A `.keras` file is loaded and rebuilt under the
    policy with its weights, since its layers keep the dtype they were saved with.
    """
    from ampflow.modeling import user_model

    spec = model_spec_of(name)
    name = spec.text
    input_shape, num_classes = tuple(int(d) for d in input_shape), int(num_classes)
    with policy_scope(policy):
        import keras

        if spec.kind == "checkpoint":
            raise _wrong_modality(name, "a pretrained BERT checkpoint (it takes text)", "images",
                                  image_model_names())
        if spec.kind == "builtin":
            if name not in _REGISTRY:
                raise _wrong_modality(name, "a text model (it takes token ids)", "images",
                                      image_model_names())
            size = image_size or _DEFAULT_IMAGE_SIZE.get(name)
            return BuiltModel(_REGISTRY[name](input_shape, num_classes, size), spec)
        model, fixes = _user_model(spec, model_path, keras.mixed_precision.global_policy().name,
                                   lambda builder: user_model.call_builder(
                                       spec, builder, input_shape, num_classes), "image")
        user_model.check_io(model, input_shape, num_classes, f"model {spec.text!r}")
        standard, head_fixes = user_model.standard_head(model)
        return BuiltModel(standard, spec, tuple(fixes + head_fixes), original=model)


def make_text_model(
    name: str,
    sequence_length: int,
    vocabulary_size: int,
    num_classes: int,
    *,
    policy: str | None = None,
    model_path: str | None = None,
    checkpoint=None,
) -> BuiltModel:
    """`make_model` for text: a model taking int32 token ids `[batch, sequence_length]`.

    `name` is a built-in text model, a user's builder (called as `build(sequence_length,
    vocabulary_size, num_classes)`), a `.keras` text model to fine-tune (rebuilt under the
    policy, weights copied; it must be tokenized with the vocabulary it was trained with) or a
    pretrained BERT checkpoint's directory (its encoder, every tensor loaded, and a new head):
    `checkpoint`, when the caller has read it already (train reads it once), else read here.
    """
    from ampflow.modeling import user_model

    spec = model_spec_of(name)
    name = spec.text
    sequence_length, vocabulary_size = int(sequence_length), int(vocabulary_size)
    num_classes = int(num_classes)
    with policy_scope(policy):
        import keras

        if spec.kind == "checkpoint":  # a pretrained BERT: its own vocabulary sizes the model
            from ampflow.modeling.pretrained import read_pretrained_bert
            from ampflow.modeling.pretrained_text import checkpoint_classifier

            if checkpoint is None:
                checkpoint = read_pretrained_bert(spec.text)
            return BuiltModel(checkpoint_classifier(checkpoint, sequence_length, num_classes),
                              spec)
        if spec.kind == "builtin":
            if name not in _TEXT_REGISTRY:
                raise _wrong_modality(name, "an image model (it takes pixels)", "text",
                                      text_model_names())
            model = _TEXT_REGISTRY[name](sequence_length, vocabulary_size, num_classes)
            return BuiltModel(model, spec)
        model, fixes = _user_model(spec, model_path, keras.mixed_precision.global_policy().name,
                                   lambda builder: user_model.call_text_builder(
                                       spec, builder, sequence_length, vocabulary_size,
                                       num_classes), "text")
        user_model.check_text_io(model, sequence_length, num_classes, f"model {spec.text!r}")
        standard, head_fixes = user_model.standard_head(model)
        return BuiltModel(standard, spec, tuple(fixes + head_fixes), original=model)


def model_spec_of(model):
    """`model` as a user_model.ModelSpec: the one a config parsed already, or text parsed here.

    Callers that hold a TrainConfig or CheckModelConfig pass its `model_spec` (parsed once).
    """
    from ampflow.modeling import user_model

    if isinstance(model, user_model.ModelSpec):
        return model
    return user_model.parse_model_spec(model, model_names())


def _user_model(spec, model_path, target: str, call, task: str):
    """A user's model (builder or `.keras` file) under the `target` policy, and what was fixed."""
    from ampflow.modeling import user_model

    if spec.kind == "builder":
        return call(user_model.import_builder(spec, model_path, task=task)), []
    loaded = user_model.load_model_file(spec.text, model_path)
    return user_model.rebuild_with_policy(loaded, target), [
        f"loaded {spec.text} and rebuilt every layer under {target} (a saved model keeps the "
        "dtypes it was saved with), weights copied"]


def _wrong_modality(name: str, what: str, data: str, choices: tuple[str, ...]):
    from ampflow.errors import ConfigError

    return ConfigError(f"model {name!r} is {what}, and this dataset holds {data}: choose one of "
                       f"{', '.join(choices)}, a builder or a .keras file. Received: "
                       f"model={name!r}")


def _preprocess(inputs, image_size: int | None, channels_out: int | None = None):
    from keras import layers

    x = layers.Rescaling(1.0 / 255.0, name="rescale")(inputs)
    if image_size is not None and tuple(inputs.shape[1:3]) != (image_size, image_size):
        x = layers.Resizing(image_size, image_size, name="resize")(x)
    if channels_out == 3 and inputs.shape[-1] == 1:
        x = layers.Concatenate(name="gray_to_rgb")([x, x, x])
    return x


def _small_cnn(input_shape, num_classes, image_size):
    """A small conv net: fast on 2 CPU cores, ~97 % on the 8×8 digits in a few epochs."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape, dtype="float32", name=IMAGES_INPUT)
    x = _preprocess(inputs, image_size)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(0.2)(x)
    x = layers.Dense(128, activation="relu")(x)
    return keras.Model(inputs, float32_head(x, num_classes), name="small_cnn")


def _application(constructor_name: str):
    def build(input_shape, num_classes, image_size):
        import keras

        inputs = keras.Input(shape=input_shape, dtype="float32", name=IMAGES_INPUT)
        x = _preprocess(inputs, image_size, channels_out=3)
        backbone = getattr(keras.applications, constructor_name)(
            include_top=False,
            weights=None,  # nothing is downloaded at run time
            input_shape=(image_size, image_size, 3),
            pooling="avg",
        )
        x = _with_fused_batch_norm(backbone)(x)
        return keras.Model(inputs, float32_head(x, num_classes), name=constructor_name.lower())

    return build


# The slowest BatchNormalization moving average a from-scratch build gets. keras.applications'
# MobileNetV2 uses 0.999, tuned for ImageNet (~5,000 steps an epoch): its moving statistics
# keep 0.999**n of their initial 0/1 after n steps, 22 % after 1,500. Measured on ampflow_mnist
# (125 steps an epoch): 12 epochs gave 0.96 training accuracy and 0.10 test accuracy, constant
# predictions in inference mode, under float32 and bfloat16 alike. 0.99 (Keras's default, and
# ResNet50's) keeps 0.99**n: 28 % after one such epoch, 4e-5 after eight.
BATCH_NORM_MAX_MOMENTUM = 0.99


def _with_fused_batch_norm(backbone):
    """`backbone` with its BatchNormalization and Conv2D layers swapped for ampflow's faster twins.

    Same names and configs: each BatchNormalization becomes the fused one, each Conv2D a
    MatmulGradientConv2D.
    Keras 3 runs BatchNormalization unfused in float32, which caps the mixed-precision gain of
    these BN-heavy nets at 1.2× on a bf16 CPU; the fused layer gives the same numbers faster
    (src/ampflow/modeling/layers.py). MatmulGradientConv2D is Conv2D except for its bfloat16 filter
    gradient on small maps, where oneDNN's AMX kernel was the slowest op of the bf16 step
    (benchmarks/results/train_bf16_gap_amx.md). The applications build plain layers, so the
    backbone is cloned; its weights are fresh initializations either way (weights=None), so
    nothing is copied. The moving-average momentum is capped at BATCH_NORM_MAX_MOMENTUM (why:
    above it).
    """
    import keras

    from ampflow.modeling.layers import FusedBatchNormalization, MatmulGradientConv2D

    def convert(layer):
        config = layer.get_config()
        if type(layer) is keras.layers.BatchNormalization:
            config["momentum"] = min(config["momentum"], BATCH_NORM_MAX_MOMENTUM)
            return FusedBatchNormalization.from_config(config)
        if type(layer) is keras.layers.Conv2D:
            return MatmulGradientConv2D.from_config(config)
        return layer.__class__.from_config(config)

    return keras.models.clone_model(backbone, clone_function=convert)


register_model("small_cnn", _small_cnn)
register_model("resnet50", _application("ResNet50"))
register_model("mobilenet_v2", _application("MobileNetV2"))
for _name in BERT_SHAPES:
    register_text_model(_name, bert_builder(_name))
