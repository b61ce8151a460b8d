"""The model's pre-flight, before the first epoch and in `ampflow check-model`.

The AMP rules (`rules.py`) on the traced step's graph (`graph.py`), their findings (`report.py`,
amp_report.json), the reload check (`reload_check.py`) and the command around them
(`check_model.py`).
"""
