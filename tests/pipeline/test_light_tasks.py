"""The pipeline's light tasks run without importing TensorFlow.

The kfp local runner starts one Python process per task, and `import tensorflow` costs each
~4-5 CPU-s on a 2-core host: for a task that reads a JSON verdict or copies a version dir,
that import is nearly its whole cost. Each test runs the real KFP component function (what
the task's executor calls), after the executor module the local runner starts, in a fresh
interpreter, on real inputs, and checks what it wrote and that `tensorflow` never entered
`sys.modules`.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

# What every task's process runs first: the executor and the artifact types.
PRELUDE = """
import json, sys
import kfp.dsl.executor_main  # noqa: F401  (the task's entry point under the local runner)
from kfp import dsl

def artifact(cls, path):
    return cls(name=path.rsplit("/", 1)[-1], uri=path)
"""


def _run_task(body: str) -> dict:
    """Run `body` after PRELUDE in a new interpreter; its last stdout line is a JSON dict."""
    code = PRELUDE + textwrap.dedent(body) + (
        '\nprint(json.dumps({**out, "tensorflow": "tensorflow" in sys.modules}))\n')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _write_evaluation(eval_dir: Path) -> None:
    """A passed evaluation as evaluate-parity publishes it: the verdict and its answers."""
    eval_dir.mkdir(parents=True)
    (eval_dir / "verdict.json").write_text(json.dumps(
        {"passed": True, "failed_checks": [], "message": "passed", "notes": [],
         "model_sha256": "0" * 64, "baselines": {}}))
    (eval_dir / "predictions.json").write_text(json.dumps(
        {"split": "test", "limit": None, "labels": [0, 1, 2], "predictions": [0, 1, 1]}))


def test_the_gates_and_the_first_comparison_with_serving_import_no_tensorflow(tmp_path):
    _write_evaluation(tmp_path / "verdict")
    out = _run_task(f"""
        from ampflow.components.evaluate_parity.component import (
            compare_serving, parity_gate, serving_gate)

        root = {str(tmp_path)!r}
        parity_gate(verdict=artifact(dsl.Artifact, root + "/verdict"))
        compared = compare_serving(
            data=artifact(dsl.Dataset, root + "/data"),
            verdict=artifact(dsl.Artifact, root + "/verdict"),
            comparison=artifact(dsl.Artifact, root + "/comparison"),
            metrics=artifact(dsl.Metrics, root + "/metrics"),
            serving_model_store=root + "/serving", model_name="ampflow")
        serving_gate(comparison=artifact(dsl.Artifact, root + "/comparison"))
        out = {{"passed": compared.gate_passed, "message": compared.gate_message}}
    """)
    assert out["passed"] is True and out["message"].startswith("no model serving to compare")
    assert out["tensorflow"] is False


def test_the_deploy_task_publishes_a_savedmodel_without_importing_tensorflow(tmp_path):
    # the deploy tests' tiny real SavedModel (serving_default images -> probabilities,
    # class_ids), in the export step's layout <saved_model>/<name>/<version>
    helpers = _deploy_helpers()
    helpers.write_saved_model(tmp_path / "saved_model" / "ampflow" / "1", seed=1)
    out = _run_task(f"""
        from ampflow.components.deploy_serving.component import deploy_serving

        root = {str(tmp_path)!r}
        endpoint = artifact(dsl.Artifact, root + "/endpoint")
        deploy_serving(saved_model=artifact(dsl.Model, root + "/saved_model"),
                       endpoint=endpoint, target="local", model_store=root + "/serving")
        out = json.loads(open(endpoint.path).read())
    """)
    assert (out["target"], out["model_name"], out["version"]) == ("local", "ampflow", 1)
    published = tmp_path / "serving" / "ampflow" / "1"
    assert (published / "saved_model.pb").read_bytes() == (
        tmp_path / "saved_model" / "ampflow" / "1" / "saved_model.pb").read_bytes()
    assert out["tensorflow"] is False


def test_deploy_reads_the_same_signature_without_tensorflow_as_with_it(tmp_path):
    """The deploy check's TensorFlow-free read gives what serving's TensorFlow read gives."""
    from ampflow.components.deploy_serving import model_store
    from ampflow.serving.model_format import DEFAULT_SIGNATURE, serving_signature_defs

    version = _deploy_helpers().write_saved_model(tmp_path / "1", seed=2)
    with_tf = serving_signature_defs(version)[DEFAULT_SIGNATURE]
    assert model_store.check_saved_model(version) == model_store.SignatureSpec.of(
        DEFAULT_SIGNATURE, with_tf)
    assert model_store.check_saved_model(version).inputs == {"images": (1, (-1, 8, 8, 1))}


def _deploy_helpers():
    """tests/components/deploy_serving/deploy_helpers.py (that dir is not on this one's path)."""
    path = Path(__file__).resolve().parents[1] / "components" / "deploy_serving" / \
        "deploy_helpers.py"
    spec = importlib.util.spec_from_file_location("deploy_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
