"""Version lifecycle through real gRPC: hot reload under load, partial dirs, deletions,
version labels changed at run time, warm-up replay."""

from __future__ import annotations

import shutil
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serving_helpers import MODEL, install_version, local_only
from tensorflow_serving.apis import (
    model_management_pb2,
    model_service_pb2_grpc,
    prediction_log_pb2,
)

from ampflow.serving.client import RpcError
from ampflow.serving.config import ModelConfig, to_model_server_config_text
from ampflow.serving.model_format import WARMUP_FILE
from ampflow.serving.models.version_source import aspired_versions
from ampflow.serving.testing import sample_images

pytestmark = [pytest.mark.serving, local_only, pytest.mark.timeout(120)]


def _wait_for(predicate, timeout_s: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def _state(client, version: int) -> str | None:
    try:
        return {r["version"]: r["state"] for r in client.status(MODEL)}.get(version)
    except RpcError:
        return None


def test_aspired_versions_policies_pick_expected_versions():
    on_disk = [1, 2, 5, 7]
    assert aspired_versions(ModelConfig("m", "/x"), on_disk) == [7]
    assert aspired_versions(ModelConfig("m", "/x", num_latest=2), on_disk) == [5, 7]
    assert aspired_versions(ModelConfig("m", "/x", version_policy="all"), on_disk) == on_disk
    specific = ModelConfig("m", "/x", version_policy="specific", versions=(2, 9))
    assert aspired_versions(specific, on_disk) == [2]


def test_hot_reload_under_load_zero_failures_and_switch_to_v2(
        model_store, tmp_path, start_server, client_for):
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    server = start_server(base, file_system_poll_wait_seconds=0.1)
    images = sample_images(2, seed=7)
    expected = {v: tf.saved_model.load(str(model_store / str(v))).signatures["serving_default"](
        images=tf.constant(images))["probabilities"].numpy() for v in (1, 2)}
    stop, switched_at = threading.Event(), []
    results: list[tuple[float, int | None, str]] = []
    lock = threading.Lock()

    def worker():  # until told to stop (after the switch), 60 s at most
        client = client_for(server.address, retries=0)
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            started = time.monotonic()
            try:
                result = client.predict(MODEL, images)
                version = result.version
                np.testing.assert_allclose(result.outputs["probabilities"], expected[version],
                                           rtol=1e-6)
                outcome = "ok"
            except Exception as e:  # recorded, asserted below
                version, outcome = None, f"{type(e).__name__}: {e}"
            with lock:
                results.append((started, version, outcome))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    # events, not sleeps: a loaded host may answer nothing in a fixed half second
    def answered(rule) -> int:
        with lock:
            return sum(1 for r in results if rule(r))

    try:
        _wait_for(lambda: answered(lambda r: r[1] == 1), what="an answer from version 1")
        install_version(model_store, base, 2)
        probe = client_for(server.address)
        _wait_for(lambda: _state(probe, 2) == "AVAILABLE", what="version 2 AVAILABLE")
        switched_at.append(time.monotonic())
        _wait_for(lambda: answered(lambda r: r[0] > switched_at[0]) >= len(threads),
                  what="requests sent after the switch answered")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    failures = [r for r in results if r[2] != "ok"]
    assert not failures, failures[:3]
    after = [r for r in results if r[0] > switched_at[0]]
    assert after and all(v == 2 for _, v, _ in after)
    assert any(v == 1 for _, v, _ in results)
    _wait_for(lambda: _state(probe, 1) == "END", what="version 1 END")


def test_partial_version_dir_is_skipped_then_loaded_once_complete(
        model_store, tmp_path, start_server, client_for):
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    server = start_server(base)
    client = client_for(server.address)
    partial = base / "2"
    # a copy caught half-way, never complete for a moment (a poll could load that)
    shutil.copytree(model_store / "2", partial, ignore=shutil.ignore_patterns("variables"))
    time.sleep(1.0)  # five polls: the dir is stable but lacks what the served version has
    assert _state(client, 2) is None  # waiting for variables/, never loaded half-written
    assert client.predict(MODEL, sample_images(1)).version == 1
    with pytest.raises(RpcError) as info:
        client.predict(MODEL, sample_images(1), version=2)
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    shutil.rmtree(partial)
    install_version(model_store, base, 2)  # the finished dir: new files, so it is retried
    _wait_for(lambda: _state(client, 2) == "AVAILABLE", what="version 2 AVAILABLE")
    assert client.predict(MODEL, sample_images(1)).version == 2


def test_corrupt_saved_model_pb_is_never_served(model_store, tmp_path, start_server, client_for):
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    install_version(model_store, base, 3, source=1)  # every file there, the pb corrupt
    (base / "3" / "saved_model.pb").write_bytes(b"\x00not a saved model")
    server = start_server(base)
    client = client_for(server.address)
    assert _state(client, 3) == "END"
    assert client.predict(MODEL, sample_images(1)).version == 1  # availability preserved


def test_deleting_served_version_dir_falls_back_without_crash(
        model_store, tmp_path, start_server, client_for):
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    install_version(model_store, base, 2)
    server = start_server(base)
    client = client_for(server.address)
    assert client.predict(MODEL, sample_images(1)).version == 2
    shutil.rmtree(base / "2")
    _wait_for(lambda: _state(client, 1) == "AVAILABLE", what="fallback to version 1")
    _wait_for(lambda: _state(client, 2) == "END", what="version 2 unloaded")
    assert client.predict(MODEL, sample_images(1)).version == 1
    shutil.rmtree(base / "1")  # nothing left on disk: NOT_FOUND (as TF Serving), server lives on
    _wait_for(lambda: _state(client, 1) == "END", what="version 1 unloaded")
    with pytest.raises(RpcError) as info:
        client_for(server.address, retries=0).predict(MODEL, sample_images(1))
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    install_version(model_store, base, 3, source=1)
    assert client.wait_until_available(MODEL, timeout=20) == 3


def test_version_labels_promote_and_roll_back_without_restart(
        model_store, tmp_path, start_server, client_for):
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    install_version(model_store, base, 2)
    model = ModelConfig(MODEL, base, version_policy="all", version_labels={"stable": 1})
    server = start_server(models=(model,), allow_reload_config=True)
    client = client_for(server.address)
    images = sample_images(1)
    assert client.predict(MODEL, images, version_label="stable").version == 1

    def relabel(**labels):
        new = ModelConfig(MODEL, base, version_policy="all", version_labels=labels)
        client.reload_config(to_model_server_config_text((new,)))

    relabel(stable=1, canary=2)
    assert client.predict(MODEL, images, version_label="canary").version == 2
    relabel(stable=2)  # promote
    assert client.predict(MODEL, images, version_label="stable").version == 2
    with pytest.raises(RpcError) as info:
        client.predict(MODEL, images, version_label="canary")
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    relabel(stable=1)  # roll back
    assert client.predict(MODEL, images, version_label="stable").version == 1
    with pytest.raises(RpcError) as info:
        relabel(stable=7)  # not loaded: refused, old labels kept
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "version 7" in info.value.details
    assert client.predict(MODEL, images, version_label="stable").version == 1
    # What a stock client sees (issue 10): the RPC itself fails with the reload's code, as in
    # TF Serving; an OK status with the error only in the response body would pass silently.
    request = model_management_pb2.ReloadConfigRequest()
    text_format.Parse(to_model_server_config_text((ModelConfig(
        MODEL, base, version_policy="all", version_labels={"stable": 9}),)), request.config)
    with grpc.insecure_channel(server.address) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raw:
            stub.HandleReloadConfigRequest(request, timeout=10)
    assert raw.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "version 9" in raw.value.details()
    assert client.predict(MODEL, images, version_label="stable").version == 1


def _reload_request(base) -> model_management_pb2.ReloadConfigRequest:
    request = model_management_pb2.ReloadConfigRequest()
    text_format.Parse(to_model_server_config_text((ModelConfig(MODEL, base),)), request.config)
    return request


def test_reload_config_is_permission_denied_unless_the_operator_allows_it(
        model_store, tmp_path, start_server):
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    elsewhere = tmp_path / "elsewhere" / MODEL
    install_version(model_store, elsewhere, 2)
    server = start_server(base)
    with grpc.insecure_channel(server.address) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        for target in (elsewhere, base):  # not even the configured path: reload is off
            with pytest.raises(grpc.RpcError) as info:
                stub.HandleReloadConfigRequest(_reload_request(target), timeout=10)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "--allow-reload-config" in info.value.details()
        empty = model_management_pb2.ReloadConfigRequest()
        empty.config.model_config_list.SetInParent()  # "unload every model"
        with pytest.raises(grpc.RpcError) as info:
            stub.HandleReloadConfigRequest(empty, timeout=10)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert server.registry.resolve(MODEL, None, None).version == 1


def test_reload_config_when_allowed_is_confined_to_the_named_roots(
        model_store, tmp_path, start_server):
    root = tmp_path / "models"
    base = root / MODEL
    install_version(model_store, base, 1)
    inside = root / "other"
    install_version(model_store, inside, 2)
    outside = tmp_path / "secrets" / MODEL
    install_version(model_store, outside, 2)
    (root / "escape").symlink_to(outside.parent)
    server = start_server(base, allow_reload_config=True, reload_config_roots=(root,))
    with grpc.insecure_channel(server.address) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        for target in (outside, root / "escape" / MODEL, root / ".." / "secrets" / MODEL):
            with pytest.raises(grpc.RpcError) as info:
                stub.HandleReloadConfigRequest(_reload_request(target), timeout=10)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, target
            if not str(target).startswith(str(root)):  # the allowed roots are not revealed
                assert str(root) not in info.value.details()
        assert server.registry.resolve(MODEL, None, None).version == 1
        stub.HandleReloadConfigRequest(_reload_request(inside), timeout=30)
    assert server.registry.resolve(MODEL, None, None).version == 2


def test_reload_config_without_roots_allows_only_the_configured_base_paths(
        model_store, tmp_path, start_server):
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    other = tmp_path / "other"
    install_version(model_store, other, 2)
    server = start_server(base, allow_reload_config=True)
    with grpc.insecure_channel(server.address) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.HandleReloadConfigRequest(_reload_request(other), timeout=10)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        stub.HandleReloadConfigRequest(_reload_request(base), timeout=10)  # same path: allowed


def test_failing_warmup_record_keeps_version_unavailable(
        model_store, tmp_path, start_server, client_for):
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    bad = install_version(model_store, tmp_path / "staging", 2)
    log = prediction_log_pb2.PredictionLog()
    log.predict_log.request.model_spec.name = MODEL
    log.predict_log.request.inputs["wrong_key"].CopyFrom(tf.make_tensor_proto(sample_images(1)))
    with tf.io.TFRecordWriter(str(bad / WARMUP_FILE)) as writer:
        writer.write(log.SerializeToString())
    shutil.move(str(bad), str(base / "2"))
    server = start_server(base)
    client = client_for(server.address)
    (row,) = [r for r in client.status(MODEL) if r["version"] == 2]
    assert row["state"] == "END" and "wrong_key" in row["error_message"]
    assert client.predict(MODEL, sample_images(1)).version == 1


def test_unknown_model_dir_reports_not_found_until_first_version(
        model_store, tmp_path, start_server, client_for):
    base = tmp_path / MODEL  # does not exist yet: the operator asked to wait for it
    server = start_server(base, wait_for_base_path=True)
    client = client_for(server.address, retries=0)
    with pytest.raises(RpcError) as info:
        client.predict(MODEL, sample_images(1))
    assert info.value.code == grpc.StatusCode.NOT_FOUND  # TF Serving's code, not UNAVAILABLE
    assert "no version of it is loaded" in info.value.details
    assert str(tmp_path) not in info.value.details
    assert _health(server.address) == health_pb2.HealthCheckResponse.NOT_SERVING
    install_version(model_store, base, 1)
    assert client.wait_until_available(MODEL, timeout=20) == 1
    # health follows the version's state a moment later (the loader thread sets it after)
    _wait_for(lambda: _health(server.address) == health_pb2.HealthCheckResponse.SERVING,
              what="health SERVING")


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service="tensorflow.serving.PredictionService")
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=10).status


def test_version_copied_in_slowly_is_not_served_until_the_copy_stops(
        model_store, tmp_path, start_server, client_for):
    """Issue 14 item 6: saved_model.pb and variables first, assets later, file by file."""
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    server = start_server(base, file_system_poll_wait_seconds=0.2)
    client = client_for(server.address)
    target = base / "2"
    target.mkdir()
    source = model_store / "2"
    shutil.copy(source / "saved_model.pb", target)  # fresh mtimes, like `cp -r`
    shutil.copytree(source / "variables", target / "variables", copy_function=shutil.copyfile)
    copied_assets = target / "assets.extra"
    copied_assets.mkdir()
    warmup = (source / WARMUP_FILE).read_bytes()
    versions_seen = set()
    for i in range(12):  # the copy goes on for ~1.2 s: one chunk every 0.1 s (< poll interval)
        with open(target / WARMUP_FILE, "ab") as f:
            f.write(warmup[i * len(warmup) // 12:(i + 1) * len(warmup) // 12])
        versions_seen.add(client.predict(MODEL, sample_images(1)).version)
        time.sleep(0.1)
    assert versions_seen == {1}, "version 2 was served while it was still being copied"
    assert _state(client, 2) is None  # not even tried: a half-written dir never fails a load
    time.sleep(1.0)  # the copy pauses for 5 poll intervals: the dir is stable, but lacks assets/
    assert client.predict(MODEL, sample_images(1)).version == 1
    assert _state(client, 2) is None
    shutil.copytree(source / "assets", target / "assets", copy_function=shutil.copyfile)
    for rest in source.iterdir():  # the rest of the top-level files (fingerprint.pb)
        if rest.is_file() and not (target / rest.name).exists():
            shutil.copyfile(rest, target / rest.name)
    _wait_for(lambda: _state(client, 2) == "AVAILABLE", what="version 2 AVAILABLE")
    assert client.predict(MODEL, sample_images(1)).version == 2


def test_dir_named_like_a_digit_is_ignored_and_polling_goes_on(
        model_store, tmp_path, start_server, client_for):
    """'²'.isdigit() is True and int('²') raises: the old poller failed on every poll."""
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    for name in ("²", "1²", "5\n"):  # a real model under a name that only looks numeric
        shutil.copytree(model_store / "1", base / name)
    server = start_server(base)
    client = client_for(server.address)
    assert client.wait_until_available(MODEL, timeout=20) == 1
    install_version(model_store, base, 2)  # the poller still runs: version 2 is picked up
    _wait_for(lambda: _state(client, 2) == "AVAILABLE", what="version 2 AVAILABLE")
    assert client.predict(MODEL, sample_images(1)).version == 2
    assert {r["version"] for r in client.status(MODEL)} <= {1, 2}


def test_settle_rule_alone_holds_back_a_complete_looking_dir_still_being_written(
        model_store, tmp_path, start_server, client_for):
    """Issue 23: every entry the served version has is there from the start (so the layout
    check passes); only "unchanged since the last poll" keeps the warm-up file, still growing,
    from being loaded (without the rule the version is tried and fails, or serves, half-copied).
    """
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    server = start_server(base, file_system_poll_wait_seconds=1.0)
    client = client_for(server.address)
    assert client.wait_until_available(MODEL, timeout=20) == 1
    source, target = model_store / "2", base / "2"
    warmup = (source / WARMUP_FILE).read_bytes()
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(WARMUP_FILE.name))
    assert {p.name for p in target.iterdir()} == {p.name for p in (base / "1").iterdir()}
    chunks = 200  # one every 20 ms: ~4 s, four poll intervals, never a pause as long as one
    with open(target / WARMUP_FILE, "ab") as f:
        for i in range(chunks):
            f.write(warmup[i * len(warmup) // chunks:(i + 1) * len(warmup) // chunks])
            f.flush()
            if i % 20 == 0:
                assert _state(client, 2) is None, "a dir still being written was tried"
            time.sleep(0.02)
    assert _state(client, 2) is None
    _wait_for(lambda: _state(client, 2) == "AVAILABLE", what="version 2 AVAILABLE")
    assert client.predict(MODEL, sample_images(1)).version == 2
