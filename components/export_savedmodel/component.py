"""KFP component: export. A thin wrapper over `run_export` (refuses a failed parity verdict)."""

from kfp.dsl import Artifact, Dataset, Input, Model, Output


def export_savedmodel(
    model: Input[Model],
    verdict: Input[Artifact],
    data: Input[Dataset],
    saved_model: Output[Artifact],
    serving_model_name: str = "ampflow",
    force: bool = False,
):
    """Export the float32 twin as `<saved_model>/<serving_model_name>/<version>/`."""
    from ampflow.components.export_savedmodel.step import ExportConfig, run_export

    result = run_export(ExportConfig(
        model_dir=model.path, data_dir=data.path, export_base=saved_model.path,
        eval_dir=verdict.path, model_name=serving_model_name, force=force))
    saved_model.metadata.update({"model_name": result.model_name, "version": result.version,
                                 "version_dir": str(result.version_dir),
                                 "framework": "tensorflow-savedmodel"})
