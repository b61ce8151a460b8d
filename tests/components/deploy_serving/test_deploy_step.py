"""The deploy step's config, its SavedModel check and the local target's atomic push."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest
from deploy_helpers import MODEL_NAME, free_port

from ampflow.components.deploy_serving import DeployConfig, cli, model_store, run_deploy
from ampflow.components.deploy_serving.model_store import DEPLOY_RECORD, VERSIONS_LOCK
from ampflow.errors import ConfigError, DeployError, ModelLoadError


def test_config_target_unknown_raises_keras_style():
    with pytest.raises(ConfigError, match=r"target must be one of .*Received: target='mars'"):
        DeployConfig(saved_model_dir="x/digits/1", target="mars", model_store="/tmp/s")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"target": "local"}, r"model_store is required for target='local'"),
        ({"target": "local", "model_store": "gs://b/m"}, r"must be a local directory"),
        ({"target": "kubernetes"}, r"model_store is required for target='kubernetes'"),
        ({"model_store": "/s", "namespace": "Bad_NS"}, r"Received: namespace='Bad_NS'"),
        ({"model_store": "/s", "version": 0}, r"version must be > 0. Received: version=0"),
        ({"model_store": "/s", "connect_timeout_s": 0}, r"connect_timeout_s must be > 0"),
        ({"model_store": "/s", "overlay": "tpu"}, r"Received: overlay='tpu'"),
    ],
)
def test_config_invalid_value_raises_config_error(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DeployConfig(saved_model_dir="x/digits/1", **kwargs)


def test_config_name_and_version_come_from_export_layout():
    config = DeployConfig(saved_model_dir="exports/digits/7", model_store="/s")
    assert (config.resolved_model_name, config.resolved_version) == ("digits", 7)


def test_config_unnumbered_dir_without_version_raises():
    config = DeployConfig(saved_model_dir="exports/digits/latest", model_store="/s")
    with pytest.raises(ConfigError, match=r"must end in a positive version number"):
        _ = config.resolved_version


def test_local_push_lands_version_atomically(export_base, tmp_path):
    store = tmp_path / "store"
    src = export_base / MODEL_NAME / "1"
    result = run_deploy(DeployConfig(saved_model_dir=src, model_store=str(store)))
    dest = store / MODEL_NAME / "1"
    assert result.model_path == str(dest) and result.version == 1 and not result.already_present
    assert (dest / "saved_model.pb").read_bytes() == (src / "saved_model.pb").read_bytes()
    assert (dest / DEPLOY_RECORD).stat().st_mode & 0o777 == 0o644  # servers run as other uids
    assert dest.stat().st_mode & 0o777 == 0o755
    # no temp dir, no claim left; the store's lock file is hidden from servers
    assert sorted(p.name for p in (store / MODEL_NAME).iterdir()) == [VERSIONS_LOCK, "1"]


def test_local_push_same_version_again_is_a_no_op(export_base, tmp_path):
    config = DeployConfig(saved_model_dir=export_base / MODEL_NAME / "1", model_store=str(tmp_path))
    run_deploy(config)
    assert run_deploy(config).already_present


def test_local_push_different_model_same_version_refused(export_base, tmp_path):
    run_deploy(
        DeployConfig(saved_model_dir=export_base / MODEL_NAME / "1", model_store=str(tmp_path))
    )
    before = (tmp_path / MODEL_NAME / "1" / "saved_model.pb").read_bytes()
    with pytest.raises(DeployError, match=r"versions are immutable"):
        run_deploy(
            DeployConfig(
                saved_model_dir=export_base / MODEL_NAME / "2", version=1, model_store=str(tmp_path)
            )
        )
    assert (tmp_path / MODEL_NAME / "1" / "saved_model.pb").read_bytes() == before


def test_local_deploy_without_version_takes_the_next_free_number(export_base, tmp_path):
    store = tmp_path / "store"
    run_deploy(DeployConfig(saved_model_dir=export_base / MODEL_NAME / "1", model_store=str(store)))
    other = tmp_path / "run2" / MODEL_NAME / "1"  # another run's export, numbered 1 too
    shutil.copytree(export_base / MODEL_NAME / "2", other)
    result = run_deploy(DeployConfig(saved_model_dir=other, model_store=str(store)))
    assert (result.version, result.already_present) == (2, False)
    record = json.loads((store / MODEL_NAME / "2" / DEPLOY_RECORD).read_text())
    assert record["version"] == 2
    assert sorted(p.name for p in (store / MODEL_NAME).iterdir()) == [VERSIONS_LOCK, "1", "2"]


def test_local_deploy_failing_before_the_copy_frees_its_claim(export_base, tmp_path, monkeypatch):
    def broken_push(*_args, **_kwargs):
        raise DeployError("disk full")

    monkeypatch.setattr(model_store, "push_local", broken_push)  # fails before its own release
    store = tmp_path / "store"
    with pytest.raises(DeployError, match="disk full"):
        run_deploy(DeployConfig(saved_model_dir=export_base / MODEL_NAME / "1",
                                model_store=str(store)))
    assert sorted(p.name for p in (store / MODEL_NAME).iterdir()) == [VERSIONS_LOCK]


def test_local_push_missing_saved_model_pb_raises_model_load_error(export_base, tmp_path):
    src = tmp_path / "exports" / MODEL_NAME / "3"
    shutil.copytree(export_base / MODEL_NAME / "1", src)
    (src / "saved_model.pb").unlink()
    store = tmp_path / "store"
    with pytest.raises(ModelLoadError, match=r"must contain saved_model.pb"):
        run_deploy(DeployConfig(saved_model_dir=src, model_store=str(store)))
    assert not store.exists()


def test_local_push_corrupt_saved_model_pb_raises_model_load_error(tmp_path):
    src = tmp_path / MODEL_NAME / "4"
    src.mkdir(parents=True)
    (src / "saved_model.pb").write_bytes(b"\xff\x00 definitely not a protobuf \x13\x37")
    with pytest.raises(ModelLoadError, match=r"(not a SavedModel|must have a 'serve' graph)"):
        run_deploy(DeployConfig(saved_model_dir=src, model_store=str(tmp_path / "store")))


def test_local_push_missing_dir_raises_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match=r"does not exist"):
        run_deploy(DeployConfig(saved_model_dir=tmp_path / "nope" / "1", model_store=str(tmp_path)))


def test_cli_help_lists_every_option_with_default(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # argparse wraps to the terminal width
    parser = argparse.ArgumentParser(prog="ampflow")
    cli.register(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit):
        parser.parse_args(["deploy", "--help"])
    out = capsys.readouterr().out
    for flag in (
        "--saved-model-dir",
        "--target",
        "--model-store",
        "--namespace",
        "--kubeconfig",
        "--context",
        "--overlay",
        "--rollout-timeout-s",
        "--connect-timeout-s",
    ):
        assert flag in out
    assert "(default: 3)" in out and "(default: ampflow)" in out  # seconds, as given


def test_local_canary_failure_takes_the_new_version_away(export_base, tmp_path):
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there, nor will during the test
    run_deploy(
        DeployConfig(saved_model_dir=export_base / MODEL_NAME / "1", model_store=str(tmp_path))
    )
    with pytest.raises(DeployError, match=r"did not become AVAILABLE at 127.0.0.1:\d+ within 1s"):
        run_deploy(
            DeployConfig(
                saved_model_dir=export_base / MODEL_NAME / "2",
                model_store=str(tmp_path),
                server_address=dead,
                canary_timeout_s=1,
            )
        )
    # version 2 is gone again, so a server polling the store keeps serving version 1
    assert sorted(p.name for p in (tmp_path / MODEL_NAME).iterdir()) == [VERSIONS_LOCK, "1"]


def test_the_kfp_deploy_task_deploys_into_its_own_pods_namespace(tmp_path):
    """In a KFP pod the default namespace is the run's (where the model-store claim it mounts
    lives), read from its service account; outside a pod, `ampflow`."""
    from ampflow.components.deploy_serving.kubernetes_cluster import own_namespace

    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("kubeflow-user-example-com\n")
    assert own_namespace("ampflow", str(namespace_file)) == "kubeflow-user-example-com"
    assert own_namespace("ampflow", str(tmp_path / "absent")) == "ampflow"


@pytest.mark.parametrize("name", ["1²", "0", "-1", "5\n", "99999999999999999999"])
def test_a_version_dir_name_that_is_no_version_is_a_config_error(tmp_path, name):
    """The one version rule (model_format.parse_version_name); str.isdigit() took '1²'."""
    config = DeployConfig(saved_model_dir=tmp_path / "ampflow" / name,
                          model_store=str(tmp_path / "store"))
    with pytest.raises(ConfigError, match="positive version number"):
        _ = config.resolved_version


def test_cli_deploy_of_a_version_another_deploy_is_copying_is_one_line(export_base, tmp_path,
                                                                       capsys):
    from ampflow.cli import main

    store = tmp_path / "store"
    model_store.claim_version(store / MODEL_NAME, exactly=5)  # a deploy copying version 5 now
    code = main(["deploy", "--saved-model-dir", str(export_base / MODEL_NAME / "1"),
                 "--model-store", str(store), "--version", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and "Traceback" not in "\n".join(err)
    assert err[-1].startswith("ampflow deploy: error: version 5 of digits is being deployed by "
                              "another deploy now")
    assert sorted(p.name for p in (store / MODEL_NAME).iterdir()) == [".5.claimed", VERSIONS_LOCK]
