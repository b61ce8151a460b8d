"""KFP component: convert to TFLite. A thin wrapper over `run_convert`."""

from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from ampflow.components.convert_tflite.config import ConvertConfig
from ampflow.kfp_args import document_args


def convert_tflite(
    saved_model: Input[Model],
    data: Input[Dataset],
    tflite: Output[Model],
    metrics: Output[Metrics],
    report: Output[Markdown],
    variants: str = "float32,float16,dynamic_range,full_int8",
):
    """Convert the exported SavedModel to the TFLite `variants` (comma-separated), each checked.

    `tflite` is a `Model` dir holding `<variant>.tflite` + `<variant>.json` per variant; its
    metadata lists each variant (file, sha256, size, quantization, accuracy, gate) and the
    SavedModel version it came from.
    """
    import json
    import shutil

    from ampflow.artifacts.versions import find_exported_version
    from ampflow.components.convert_tflite.step import ConvertConfig, run_convert
    from ampflow.serving.model_format import DEFAULT_SIGNATURE

    version_dir = find_exported_version(saved_model.path)
    result = run_convert(ConvertConfig(
        saved_model_dir=version_dir, data_dir=data.path,
        output_dir=tflite.path, variants=tuple(v.strip() for v in variants.split(",") if v)))
    for name, variant in result.variants.items():
        metrics.log_metric(f"{name}_accuracy", float(variant.metrics["accuracy"]))
        metrics.log_metric(f"{name}_size_bytes", float(variant.size_bytes))
    shutil.copyfile(result.report_md, report.path)
    described = {}
    for name, variant in result.variants.items():
        meta = json.loads(variant.metadata_path.read_text())
        described[name] = {"file": meta["file"], "sha256": meta["sha256"],
                           "size_bytes": variant.size_bytes,
                           "quantization": meta["quantization"],
                           "accuracy": float(variant.metrics["accuracy"]),
                           "passed": variant.passed}
    tflite.metadata.update({
        "framework": "tflite", "format": "tflite",
        "framework_version": meta["converter"]["tensorflow"] if described else None,
        "source_model_name": version_dir.parent.name, "source_version": int(version_dir.name),
        # a text model's variants carry token_ids (the variant JSON says which)
        "signature_key": meta["signature_key"] if described else DEFAULT_SIGNATURE,
        "modality": meta.get("modality", "image") if described else "image",
        "shipped_files": json.loads(result.report_json.read_text()).get("shipped_files", []),
        "variants": described, "passed": result.passed})


document_args(convert_tflite, ConvertConfig, notes={"variants": "Comma-separated"}, own={
    "saved_model": "export-savedmodel's output: <model_name>/<version>/ with the SavedModel.",
    "data": "The prepared dataset (prepare-data's output): each variant is checked on its "
            "test split.",
})
