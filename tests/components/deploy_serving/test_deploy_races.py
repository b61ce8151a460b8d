"""Deploys into one local model store at the same moment (issue 24 item 3, issue 41 point 5).

Real processes released at once, one running the deploy component as a pipeline task does and
two running `ampflow deploy` as a user does: the step claims the number, so they must get
distinct versions, each holding exactly the model its run exported, and leave nothing
half-copied behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from ampflow.components.deploy_serving import model_store
from ampflow.errors import DeployError
from ampflow.serving.model_format import version_dirs
from ampflow.serving.testing import write_model_version

pytestmark = pytest.mark.timeout(300)

RUNS = 3  # run 0 is the pipeline's component, the others the command line

_START_LINE = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    export, store, endpoint, go = sys.argv[1:5]
    Path(endpoint + ".ready").touch()
    while not os.path.exists(go):
        time.sleep(0.001)
""")
_COMPONENT = _START_LINE + textwrap.dedent("""
    from kfp import dsl
    from ampflow.components.deploy_serving.component import deploy_serving
    deploy_serving(saved_model=dsl.Model(uri=export),
                   endpoint=dsl.Artifact(uri=endpoint), target="local", model_store=store)
""")
_COMMAND_LINE = textwrap.dedent("""
    import ampflow.cli
    import ampflow.components.deploy_serving.step  # TensorFlow imported before the start line
""") + _START_LINE + textwrap.dedent("""
    sys.exit(ampflow.cli.main(["deploy", "--saved-model-dir", export + "/ampflow/1",
                               "--model-store", store]))
""")


@pytest.mark.slow  # three processes that each import TensorFlow
def test_concurrent_deploys_get_distinct_versions_each_whole(tmp_path):
    store = tmp_path / "store"
    write_model_version(store / "ampflow", 1, seed=100)  # what the server serves today
    exports = [tmp_path / f"run{i}" for i in range(RUNS)]
    for i, export in enumerate(exports):  # every run exports its own version 1
        write_model_version(export / "ampflow", 1, seed=i)
    go = tmp_path / "go"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    runs = [subprocess.Popen([sys.executable, "-c", _COMPONENT if i == 0 else _COMMAND_LINE,
                              str(export), str(store), str(tmp_path / f"endpoint{i}.json"),
                              str(go)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i, export in enumerate(exports)]
    # every process imported TensorFlow, at the start line: three imports on a loaded 2-core
    # host took no fixed time, so the only bound is the test's timeout; a process that died
    # before its line fails at once
    while not all((tmp_path / f"endpoint{i}.json.ready").exists() for i in range(RUNS)):
        assert all(run.poll() is None for run in runs), [run.stderr.read()[-3000:]
                                                         for run in runs if run.poll()]
        time.sleep(0.05)
    go.touch()
    outputs = [run.communicate(timeout=240) for run in runs]
    for run, (_out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err[-3000:]
    versions = sorted(version_dirs(store / "ampflow"))
    assert versions == list(range(1, 2 + RUNS))
    deployed = {model_store.dir_digest(store / "ampflow" / str(v)): v for v in versions[1:]}
    for export in exports:  # each run's model is one of the new versions, whole
        assert model_store.dir_digest(export / "ampflow" / "1") in deployed
    component_record = json.loads((tmp_path / "endpoint0.json").read_text())
    assert deployed[model_store.dir_digest(exports[0] / "ampflow" / "1")] == \
        component_record["version"]
    leftovers = {p.name for p in (store / "ampflow").iterdir()} - {str(v) for v in versions}
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


def test_claim_of_the_newest_versions_content_reuses_it_unclaimed(tmp_path):
    base = tmp_path / "ampflow"
    write_model_version(base, 1, seed=1)
    write_model_version(base, 2, seed=2)
    assert model_store.claim_version(base, same_as=base / "2") == 2  # a re-run: no new number
    assert model_store.claim_version(base, same_as=base / "1") == 3  # not the newest: new number
    assert model_store.claim_version(base, same_as=base / "2") == 4  # 3 is claimed above 2


def test_claim_of_a_given_version_refused_while_another_deploy_copies_it(tmp_path):
    base = tmp_path / "ampflow"
    assert model_store.claim_version(base, exactly=5) == 5
    with pytest.raises(DeployError, match=r"version 5 of ampflow is being deployed by another"):
        model_store.claim_version(base, exactly=5)
    model_store.release_claim(base, 5)
    assert model_store.claim_version(base, exactly=5) == 5
