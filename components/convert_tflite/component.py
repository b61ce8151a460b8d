"""KFP component: convert to TFLite. A thin wrapper over `run_convert`."""

from kfp.dsl import Artifact, Dataset, Input, Markdown, Metrics, Output


def convert_tflite(
    saved_model: Input[Artifact],
    data: Input[Dataset],
    tflite: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[Markdown],
    variants: str = "float32,float16,dynamic_range,full_int8",
):
    """Convert the exported SavedModel to the TFLite `variants` (comma-separated), each checked."""
    import shutil

    from ampflow.components.convert_tflite.step import ConvertConfig, run_convert
    from ampflow.components.export_savedmodel.versions import find_exported_version

    result = run_convert(ConvertConfig(
        saved_model_dir=find_exported_version(saved_model.path), data_dir=data.path,
        output_dir=tflite.path, variants=tuple(v.strip() for v in variants.split(",") if v)))
    for name, variant in result.variants.items():
        metrics.log_metric(f"{name}_accuracy", float(variant.metrics["accuracy"]))
        metrics.log_metric(f"{name}_size_bytes", float(variant.size_bytes))
    shutil.copyfile(result.report_md, report.path)
    tflite.metadata.update({"variants": sorted(result.variants), "passed": result.passed})
