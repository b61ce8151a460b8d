"""KFP component: pretrain. A thin wrapper: the prepared Dataset in, `run_pretrain` out.

Its `model` output is the checkpoint dir in the Hugging Face layout, the form the train
component's `base_model` input takes (the pipeline wires one to the other with
`--pretrain-epochs`); its `metrics` the masked-LM loss of the first and the last epoch.
"""

from kfp.dsl import Dataset, Input, Metrics, Model, Output

from ampflow.components.pretrain.config import PretrainStepConfig
from ampflow.kfp_args import document_args


def pretrain(
    data: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    num_hidden_layers: int = 2,
    hidden_size: int = 128,
    num_attention_heads: int = 2,
    max_sequence_length: int = 64,
    vocabulary_size: int = 8000,
    lower_case: bool = True,
    epochs: int = 8,
    batch_size: int = 32,
    learning_rate: float = 0.001,
    mask_rate: float = 0.15,
    steps_per_epoch: int = 0,
    seed: int = 0,
):
    """Pretrain a BERT encoder (masked LM) on the prepared texts; publish it and its losses.

    The defaults are spelt out because KFP copies this function's source into its task;
    tests/components/pretrain/test_pretrain_component.py ties each to the pretrain step's own
    (PretrainStepConfig), whose fields' help is also the Args KFP shows.
    """
    from ampflow.components.pretrain import PretrainStepConfig, run_pretrain

    result = run_pretrain(PretrainStepConfig(
        data_dir=data.path, output_dir=model.path, num_hidden_layers=num_hidden_layers,
        hidden_size=hidden_size, num_attention_heads=num_attention_heads,
        max_sequence_length=max_sequence_length, vocabulary_size=vocabulary_size,
        lower_case=lower_case, epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, mask_rate=mask_rate,
        steps_per_epoch=steps_per_epoch or None, seed=seed))
    report = result.report
    model.metadata.update({"format": "huggingface", "model_type": "bert",
                           "num_hidden_layers": num_hidden_layers, "hidden_size": hidden_size,
                           "max_position_embeddings": max_sequence_length,
                           "vocabulary_size": report["vocabulary_size"]})
    losses = report["masked_lm_loss_per_epoch"]
    metrics.log_metric("masked_lm_loss_first_epoch", float(losses[0]))
    metrics.log_metric("masked_lm_loss_last_epoch", float(losses[-1]))
    for key in ("texts", "steps_per_epoch", "seconds"):
        metrics.log_metric(key, float(report[key]))


document_args(pretrain, PretrainStepConfig, notes={
    "steps_per_epoch": "0: the whole corpus once (KFP has no None)",
}, own={
    "data": "The prepared text dataset (prepare-data's output); its training split's texts "
            "are the corpus, its test split is never read.",
})
