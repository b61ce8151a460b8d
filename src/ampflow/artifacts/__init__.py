"""The artifacts library beneath the steps: the contracts of what one step hands the next.

The model dir (`model_dir.py`: its files, loading it back), the summary's throughput unit, the
gate's verdict (`verdict.py`), the SavedModel versions (`versions.py`) and canary examples, the
exported signatures' text names (`signature_names.py`) and the TFLite variants' names. A step
writes and reads these through this package only, never through another step.
"""
