"""KFP component: export. A thin wrapper over `run_export` (refuses a failed parity verdict)."""

from kfp.dsl import Artifact, Dataset, Input, Model, Output

from ampflow.components.export_savedmodel.step import ExportConfig
from ampflow.kfp_args import document_args


def export_savedmodel(
    model: Input[Model],
    verdict: Input[Artifact],
    data: Input[Dataset],
    saved_model: Output[Model],
    model_name: str = "ampflow",
    force: bool = False,
):
    """Export the float32 twin as `<saved_model>/<model_name>/<version>/` (a `Model`).

    The artifact's metadata says what a model registry needs: framework, format, name,
    version, signatures, the precision it was trained in, and the sha256 of the trained model
    whose parity verdict let it through.
    """
    from ampflow.components.export_savedmodel.step import ExportConfig, run_export

    result = run_export(ExportConfig(
        model_dir=model.path, data_dir=data.path, export_base=saved_model.path,
        eval_dir=verdict.path, model_name=model_name, force=force))
    meta = result.metadata
    saved_model.metadata.update({
        "framework": "tensorflow",
        "framework_version": meta["versions"]["tensorflow"],
        "format": "saved_model",
        "model_name": result.model_name,
        "version": result.version,
        "version_dir": f"{result.model_name}/{result.version}",
        "modality": meta["modality"],  # "image" or "text": which signatures these are
        "signatures": meta["signatures"],
        "labels": meta["labels"],
        "trained_policy": meta["source"]["trained_policy"],
        "exported_policy": meta["source"]["exported_policy"],
        "trained_model_sha256": meta["gate"]["model_sha256"],
        "forced": result.forced,
    })


document_args(export_savedmodel, ExportConfig, own={
    "model": "The AMP-trained model (train-amp's output).",
    "verdict": "evaluate-parity's verdict: export refuses a failed one unless `force`.",
    "data": "The prepared dataset (prepare-data's output): the export's parity check and "
            "warm-up examples come from its test split.",
})
