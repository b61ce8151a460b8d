"""Two deploys into one local model store at the same moment (issue 24, item 3).

Real processes, each running the deploy component as a pipeline task does, released at once:
they must get distinct versions, each holding exactly the model its run exported, and leave
nothing half-copied behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ampflow.components.deploy_serving import model_store
from ampflow.serving.model_format import version_dirs
from ampflow.serving.testing import write_model_version

pytestmark = pytest.mark.timeout(300)

RUNS = 3

_DEPLOY = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from kfp import dsl
    from ampflow.components.deploy_serving.component import deploy_serving
    export, store, endpoint, go = sys.argv[1:5]
    Path(endpoint + ".ready").touch()
    while not os.path.exists(go):
        time.sleep(0.001)
    deploy_serving(saved_model=dsl.Model(uri=export),
                   endpoint=dsl.Artifact(uri=endpoint), target="local", model_store=store)
""")


@pytest.mark.slow  # three processes that each import TensorFlow
def test_concurrent_deploys_get_distinct_versions_each_whole(tmp_path):
    store = tmp_path / "store"
    write_model_version(store / "ampflow", 1, seed=100)  # what the server serves today
    exports = [tmp_path / f"run{i}" for i in range(RUNS)]
    for i, export in enumerate(exports):  # every pipeline run exports its own version 1
        write_model_version(export / "ampflow", 1, seed=i)
    go = tmp_path / "go"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    runs = [subprocess.Popen([sys.executable, "-c", _DEPLOY, str(export), str(store),
                              str(tmp_path / f"endpoint{i}.json"), str(go)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i, export in enumerate(exports)]
    deadline = time.monotonic() + 120  # every process imported TensorFlow, at the start line
    while not all((tmp_path / f"endpoint{i}.json.ready").exists() for i in range(RUNS)):
        assert time.monotonic() < deadline and all(run.poll() is None for run in runs)
        time.sleep(0.05)
    go.touch()
    outputs = [run.communicate(timeout=240) for run in runs]
    for run, (_out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err[-3000:]
    records = [json.loads((tmp_path / f"endpoint{i}.json").read_text()) for i in range(RUNS)]
    versions = sorted(record["version"] for record in records)
    assert versions == list(range(2, 2 + RUNS))
    for export, record in zip(exports, records, strict=True):  # each holds its own run's model
        deployed = model_store.dir_digest(Path(record["model_path"]))
        assert deployed == model_store.dir_digest(export / "ampflow" / "1")
    assert sorted(version_dirs(store / "ampflow")) == [1, *versions]
    leftovers = {p.name for p in (store / "ampflow").iterdir()} - {str(v) for v in [1, *versions]}
    assert leftovers == {model_store.VERSIONS_LOCK}  # no staging dir, no claim left


def test_claim_counts_a_deploy_still_copying(tmp_path):
    base = tmp_path / "ampflow"
    write_model_version(base, 1)
    first = model_store.claim_version(base)
    assert first == 2
    assert model_store.claim_version(base) == 3  # the first is still copying: not 2 again
    assert model_store.claim_version(base, at_least=7) == 7


def test_failed_copy_frees_its_claim_and_leaves_no_version(tmp_path):
    base = tmp_path / "ampflow"
    version = model_store.claim_version(base)
    with pytest.raises(Exception, match="could not copy"):
        model_store.push_local(tmp_path / "absent", base / str(version), {})
    assert not (base / str(version)).exists()
    assert {p.name for p in base.iterdir()} == {model_store.VERSIONS_LOCK}
