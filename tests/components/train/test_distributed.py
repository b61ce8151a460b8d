"""Multi-worker training: TF_CONFIG, the local launcher, agreement across replicas, resume.

The slow tests start real worker processes on loopback (2 workers, the small CNN, a few dozen
steps) with MultiWorkerMirroredStrategy, exactly as a TFJob would; each is bounded by a timeout.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ampflow.components.train import TrainConfig, run_train
from ampflow.components.train.cluster import (
    PEER_LOST_EXIT_CODE,
    choose_strategy,
    parse_tf_config,
    read_tf_config,
)
from ampflow.components.train.launcher import (
    WorkerFailedError,
    _wait,
    config_to_argv,
    local_ports,
    run_workers,
    tf_configs,
)
from ampflow.errors import ConfigError

DRIVER = Path(__file__).with_name("worker_driver.py")
WORKER_TIMEOUT_S = 420  # a loaded 2-core machine: two TF imports, tracing, XLA compiles
# Final training loss of 2 workers × batch 16 vs 1 process × batch 32, same seed: both see the
# same global batches in the same order and average the same gradients, so they differ only by
# float summation order and dropout masks drawn per replica (measured |diff| <= 0.03 in float32
# after 2 epochs; bf16/fp16 round more). 0.08 fails any real divergence (a skipped all-reduce,
# a different data order, a wrong loss scale) while passing on every machine of this kind.
LOSS_TOLERANCE = 0.08


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **extra)
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, str(DRIVER), *args]


def _train_args(data_dir, out, *extra) -> list[str]:
    return ["train", "--data-dir", str(data_dir), "--output-dir", str(out), "--seed", "7",
            *extra]


# ---- TF_CONFIG and strategy choice (no TensorFlow work) ---------------------------------------

@pytest.mark.parametrize(("config", "message"), [
    ({"cluster": {"worker": ["a:1"]}}, "must name this process's task"),
    ({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 2}},
     r"task.index must be in \[0, 2\)"),
    ({"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "worker", "index": 0}},
     "may only hold 'chief' and 'worker'"),
    ({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}},
     "distinct addresses"),
    ({"cluster": {"worker": ["no-port"]}, "task": {"type": "worker", "index": 0}},
     "list of 'host:port'"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}},
     "task.type must be one of"),
    (["not", "a", "dict"], "TF_CONFIG must be"),
])
def test_bad_tf_config_is_a_clear_error(config, message):
    with pytest.raises(ConfigError, match=message):
        parse_tf_config(config)


def test_tf_config_chief_and_workers_give_worker_ids():
    spec = parse_tf_config({"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]},
                            "task": {"type": "worker", "index": 1}})
    assert (spec.num_workers, spec.worker_id, spec.is_chief, spec.address) == (3, 2, False, "w:2")
    assert parse_tf_config({"cluster": {"chief": ["c:1"], "worker": ["w:1"]},
                            "task": {"type": "chief", "index": 0}}).is_chief


def test_tf_config_that_is_not_json_is_a_clear_error():
    with pytest.raises(ConfigError, match="TF_CONFIG must be JSON"):
        read_tf_config({"TF_CONFIG": "{cluster: "})
    assert read_tf_config({"TF_CONFIG": ""}) is None


@pytest.mark.parametrize(("requested", "workers", "gpus", "expected"), [
    ("auto", 0, 0, "default"), ("auto", 0, 2, "mirrored"), ("auto", 2, 0, "multi_worker"),
    ("auto", 1, 4, "mirrored"), ("multi_worker", 1, 0, "multi_worker"),
    ("mirrored", 0, 0, "mirrored"),
])
def test_choose_strategy(requested, workers, gpus, expected):
    cluster = None
    if workers:
        cluster = parse_tf_config({"cluster": {"worker": [f"h:{i + 1}" for i in range(workers)]},
                                   "task": {"type": "worker", "index": 0}})
    assert choose_strategy(requested, cluster, gpus)[0] == expected


def test_choose_strategy_rejects_contradictions():
    two = parse_tf_config({"cluster": {"worker": ["a:1", "b:1"]},
                           "task": {"type": "worker", "index": 0}})
    with pytest.raises(ConfigError, match="runs one process, but TF_CONFIG names 2 tasks"):
        choose_strategy("default", two, 0)
    with pytest.raises(ConfigError, match="strategy=multi_worker needs TF_CONFIG"):
        choose_strategy("multi_worker", None, 0)


def test_trainer_v2_pod_env_gives_the_tf_config_of_its_jobset_pods():
    env = {"AMPFLOW_TF_CONFIG_FROM": "trainer-v2", "AMPFLOW_WORKER_INDEX": "1",
           "AMPFLOW_NUM_WORKERS": "3", "AMPFLOW_WORKER_PORT": "2222",
           "HOSTNAME": "my-run-node-0-1"}
    spec = read_tf_config(env)
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["my-run-node-0-0.my-run:2222", "my-run-node-0-1.my-run:2222",
                               "my-run-node-0-2.my-run:2222"]},
        "task": {"type": "worker", "index": 1}}
    assert spec.worker_id == 1 and not spec.is_chief


@pytest.mark.parametrize(("override", "message"), [
    ({"AMPFLOW_NUM_WORKERS": "1"}, "must be < AMPFLOW_NUM_WORKERS"),
    ({"AMPFLOW_NUM_WORKERS": ""}, "AMPFLOW_NUM_WORKERS must be a non-negative integer"),
    ({"HOSTNAME": "some-pod-7"}, "HOSTNAME must be '<trainjob>-node-0-1'"),
])
def test_trainer_v2_pod_env_mistakes_are_clear_errors(override, message):
    env = {"AMPFLOW_TF_CONFIG_FROM": "trainer-v2", "AMPFLOW_WORKER_INDEX": "1",
           "AMPFLOW_NUM_WORKERS": "2", "HOSTNAME": "run-node-0-1", **override}
    with pytest.raises(ConfigError, match=message):
        read_tf_config(env)


# ---- the launcher (no TensorFlow work) --------------------------------------------------------

def test_config_to_argv_rebuilds_the_same_config(tmp_path):
    from ampflow.cli import build_parser
    from ampflow.cliutil import config_from_args

    config = TrainConfig(data_dir=tmp_path, output_dir=tmp_path / "o", precision="float32",
                         jit_compile=False, workers=3, scale_learning_rate=True,
                         checkpoint_dir="gs://b/c", steps_per_epoch=5, launcher_port=4000)
    args = build_parser(("ampflow.components.train.cli",)).parse_args(
        ["train", *config_to_argv(config)])
    rebuilt = config_from_args(TrainConfig, args)
    assert rebuilt == TrainConfig(**{**config.__dict__, "workers": 1, "launcher_port": None})


def test_launcher_stops_every_worker_when_one_fails(tmp_path):
    """Worker 1 fails at once; worker 0 (which would run for a minute) must be stopped."""
    said_hello = tmp_path / "worker-0-said-hello"  # worker 1 fails only after that
    script = ("import json, os, pathlib, sys, time\n"
              "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
              "print('hello from', index, flush=True)\n"
              f"marker = pathlib.Path({str(said_hello)!r})\n"
              "if index == 0:\n"
              "    marker.touch()\n"
              "if index == 1:\n"
              "    deadline = time.monotonic() + 30\n"
              "    while not marker.exists() and time.monotonic() < deadline:\n"
              "        time.sleep(0.01)\n"
              "    print('ampflow train: error: bad thing', file=sys.stderr); sys.exit(3)\n"
              "time.sleep(60)\n")
    sink = io.StringIO()  # the launcher's stream: what a terminal would show
    began = time.monotonic()
    with pytest.raises(WorkerFailedError, match="worker 1 exited with code 3: bad thing; "
                                                "stopped the other workers") as error:
        run_workers([sys.executable, "-c", script], tf_configs(local_ports(2)), stream=sink)
    assert time.monotonic() - began < 30
    assert error.value.exit_code == 3
    output = sink.getvalue()
    assert "[worker 0] hello from 0" in output and "[worker 1] hello from 1" in output


def test_launcher_names_the_failed_worker_not_the_peer_that_lost_it():
    """Worker 1 died; worker 0 then exited 'peer lost' (138) before the next poll: the
    report must name worker 1, the cause (the lowest index was named before)."""

    class Exited:
        def __init__(self, code):
            self.code = code

        def poll(self):
            return self.code

    assert _wait([Exited(PEER_LOST_EXIT_CODE), Exited(-9)]) == (1, -9)
    assert _wait([Exited(PEER_LOST_EXIT_CODE), Exited(0)]) == (0, PEER_LOST_EXIT_CODE)
    assert _wait([Exited(0), Exited(0)]) is None


def test_launcher_keeps_each_worker_line_whole_when_workers_print_at_once():
    """Workers finish in lockstep and log the same lines at the same moment; every line the
    launcher writes must be one whole line of one worker (CI once saw `[worker 1] ...[worker 0]
    ...` on one line, and the test that reads each worker's weight hash miss worker 0's)."""
    script = ("import json, os\n"
              "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
              "for n in range(300):\n"
              "    print(f'line {n} of worker {index}', flush=True)\n")
    writes: list[str] = []

    class SlowSink:  # a pipe to a busy reader: each write takes a moment, other threads run
        def write(self, text):
            writes.append(text)
            time.sleep(0.0005)

        def flush(self):
            pass

    run_workers([sys.executable, "-c", script], tf_configs(local_ports(2)), stream=SlowSink())
    lines = "".join(writes).split("\n")
    assert lines[-1] == ""  # the output ends with a newline
    expected = {f"[worker {i}] line {n} of worker {i}" for i in (0, 1) for n in range(300)}
    assert sorted(lines[:-1]) == sorted(expected)

def test_launcher_port_in_use_is_a_clear_error_before_anything_starts(tmp_path, prepared_digits):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "out", workers=2,
                             launcher_port=port)
        with pytest.raises(ConfigError, match=rf"port {port} is already in use \(the local "
                                              r"cluster needs ports"):
            run_train(config)
    assert not (tmp_path / "out" / "metadata.json").exists()


def test_workers_with_tf_config_already_set_is_a_clear_error(tmp_path, prepared_digits,
                                                             monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_configs([1, 2])[0]))
    with pytest.raises(ConfigError, match="--workers starts a local cluster"):
        run_train(TrainConfig(data_dir=prepared_digits, output_dir=tmp_path, workers=2))


def test_tf_config_port_in_use_is_one_clear_line(tmp_path, prepared_digits):
    """A worker started by hand whose TF_CONFIG port is taken: exit 2 and one line, no hang."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        tf_config = {"cluster": {"worker": [f"127.0.0.1:{port}", "127.0.0.1:1"]},
                     "task": {"type": "worker", "index": 0}}
        done = subprocess.run(
            _cli(*_train_args(prepared_digits, tmp_path / "out")),
            env=_env(TF_CONFIG=json.dumps(tf_config)), capture_output=True, text=True,
            timeout=180)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()
              and not line.startswith(("E0000", "W0000", "I0000"))]
    assert errors == [f"ampflow train: error: port {port} of this task (worker 0 of 2 "
                      f"(127.0.0.1:{port}), from TF_CONFIG) is already in use: stop what holds "
                      "it or give this task another port"]


def test_bad_tf_config_is_one_clear_line(tmp_path, prepared_digits):
    done = subprocess.run(_cli(*_train_args(prepared_digits, tmp_path / "out")),
                          env=_env(TF_CONFIG='{"cluster": {"worker": ["a:1"]}, "task": 3}'),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(
        "ampflow train: error: TF_CONFIG must name this process's task")


# ---- real workers -------------------------------------------------------------------------------

def _start_by_hand(args: list[str], count: int = 2) -> list[subprocess.Popen]:
    """Start `count` workers the way a TFJob does: the same command, each with its TF_CONFIG."""
    procs = []
    for tf_config in tf_configs(local_ports(count)):
        procs.append(subprocess.Popen(_cli(*args), env=_env(TF_CONFIG=json.dumps(tf_config)),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    return procs


def _finish(procs: list[subprocess.Popen], timeout: float = WORKER_TIMEOUT_S) -> list[str]:
    outputs = [""] * len(procs)

    def read(i):
        outputs[i] = procs[i].stdout.read()

    readers = [threading.Thread(target=read, args=(i,)) for i in range(len(procs))]
    for r in readers:
        r.start()
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for r in readers:
            r.join(timeout=10)
    return outputs


def _sha(output: str) -> str:
    return re.search(r"final weights sha256 ([0-9a-f]{64})", output).group(1)


def _single_process_loss(prepared_digits, tmp_path, policy, steps):
    meta = run_train(TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "single",
                                 precision=policy, batch_size=32, epochs=2,
                                 steps_per_epoch=steps, seed=7)).metadata
    return meta


@pytest.mark.slow
def test_two_workers_started_by_hand_match_one_process_float32(prepared_digits, tmp_path):
    """Two processes with TF_CONFIG (as a TFJob starts them): identical weights on both,
    only the chief published, the same loss as one process with the same global batch."""
    out = tmp_path / "out"
    procs = _start_by_hand(_train_args(prepared_digits, out, "--precision", "float32",
                                       "--batch-size", "16", "--epochs", "2",
                                       "--steps-per-epoch", "20"))
    outputs = _finish(procs)
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    meta = json.loads((out / "metadata.json").read_text())
    dist = meta["distribution"]
    assert (dist["strategy"], dist["num_workers"], dist["num_replicas"],
            dist["global_batch_size"], dist["per_replica_batch_size"]) == (
        "multi_worker", 2, 2, 32, 16)
    assert _sha(outputs[0]) == _sha(outputs[1]) == meta["weights_sha256"]
    assert dist["weights_identical_on_all_workers"] is True
    assert "the chief publishes the model" in outputs[1]
    assert sorted(p.name for p in out.iterdir()) == [
        "amp_report.json", "config.json", "epochs.jsonl", "loss_scale_history.json",
        "metadata.json", "model.keras", "tensorboard"]
    assert not (out / "backup").exists()
    info = json.loads((Path(prepared_digits) / "dataset_info.json").read_text())
    assert meta["epochs"][-1]["val_examples"] == info["splits"]["test"]  # global, not a shard
    single = _single_process_loss(prepared_digits, tmp_path, "float32", 20)
    assert abs(meta["final_metrics"]["loss"] - single["final_metrics"]["loss"]) < LOSS_TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_local_launcher_two_workers_match_one_process(policy, prepared_digits, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "ampflow.cli", *_train_args(
            prepared_digits, out, "--precision", policy, "--batch-size", "16", "--epochs", "2",
            "--steps-per-epoch", "20", "--workers", "2")],
        env=_env(), capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["precision"]["policy"] == policy
    assert meta["distribution"]["num_workers"] == 2
    shas = re.findall(r"\[worker (\d)\] .*final weights sha256 ([0-9a-f]{64})", done.stderr)
    assert sorted(shas) == [("0", meta["weights_sha256"]), ("1", meta["weights_sha256"])], (
        done.stderr[-3000:])
    if policy == "mixed_float16":
        assert meta["loss_scale"]["enabled"] and meta["xla"]["effective"]
        assert "all-reduce and the optimizer update run outside XLA" in meta["xla"]["scope"]
    single = _single_process_loss(prepared_digits, tmp_path, policy, 20)
    assert abs(meta["final_metrics"]["loss"] - single["final_metrics"]["loss"]) < LOSS_TOLERANCE


@pytest.mark.slow
def test_infinite_gradients_on_one_worker_only_make_every_worker_skip_and_stop(prepared_digits,
                                                                               tmp_path):
    """Keras's LossScaleOptimizer decides "skip" on each worker's local gradients: without an
    agreement the worker with inf gradients skips while the other waits in the all-reduce
    (a hang). With it, both skip every step and the scale-floor guard stops both, together."""
    procs = _start_by_hand(_train_args(
        prepared_digits, tmp_path / "out", "--model", "test_inf_gradient_on_replica_1",
        "--precision", "mixed_float16", "--batch-size", "16", "--epochs", "10",
        "--steps-per-epoch", "4", "--guard-warmup-steps", "1000"))
    outputs = _finish(procs, timeout=300)
    assert [p.returncode for p in procs] == [1, 1], outputs[0][-3000:] + outputs[1][-3000:]
    for output in outputs:
        assert "loss scale fell to 0.5, below the floor 1" in output
        assert "at step 16 (16 steps skipped" in output
    assert not (tmp_path / "out" / "metadata.json").exists()


@pytest.mark.slow
def test_mirrored_strategy_with_inf_gradients_on_one_replica_skips_instead_of_nan(
        prepared_digits, tmp_path):
    """MirroredStrategy: Keras takes replica 0's verdict only, so replica 1's inf would be
    averaged into the weights (NaN). The agreed verdict makes both replicas skip."""
    done = subprocess.run(
        _cli(*_train_args(prepared_digits, tmp_path / "out", "--strategy", "mirrored",
                          "--model", "test_inf_gradient_on_replica_1",
                          "--precision", "mixed_float16", "--batch-size", "16",
                          "--epochs", "10", "--steps-per-epoch", "4",
                          "--guard-warmup-steps", "1000")),
        env=_env(AMPFLOW_TEST_LOGICAL_CPUS="2"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "loss scale fell to 0.5, below the floor 1" in done.stderr
    assert "loss became non-finite" not in done.stderr


@pytest.mark.slow
def test_mirrored_strategy_two_replicas_in_one_process_train_and_publish(prepared_digits,
                                                                         tmp_path):
    """A BatchNormalization model (whose moving statistics each replica updates) on two
    logical CPUs: trains, averages the statistics, publishes one model."""
    done = subprocess.run(
        _cli(*_train_args(prepared_digits, tmp_path / "out", "--strategy", "mirrored",
                          "--precision", "float32", "--batch-size", "16", "--epochs", "2",
                          "--steps-per-epoch", "5", "--model", "test_batch_norm_cnn")),
        env=_env(AMPFLOW_TEST_LOGICAL_CPUS="2"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert (meta["distribution"]["strategy"], meta["distribution"]["num_replicas"],
            meta["distribution"]["num_workers"]) == ("mirrored", 2, 1)
    assert meta["distribution"]["global_batch_size"] == 32


@pytest.mark.slow
def test_worker_killed_with_sigkill_stops_the_job_and_a_restart_resumes(prepared_digits,
                                                                        tmp_path):
    """The launcher stops the survivor at once; the rerun (as a TFJob restart) resumes from the
    durable checkpoint dir and finishes the planned epochs.

    The model (a user's builder) has BatchNormalization: each worker updates its moving
    statistics from its own shard, and they are averaged before evaluation, checkpoints and the
    save, so both workers end identical, resumed statistics included (the weights hash covers
    them too)."""
    checkpoints = tmp_path / "durable"
    argv = [sys.executable, "-m", "ampflow.cli", *_train_args(
        prepared_digits, tmp_path / "out", "--model", "worker_driver:batch_norm_cnn",
        "--model-path", str(DRIVER.parent), "--precision", "float32", "--batch-size", "16",
        "--epochs", "6", "--steps-per-epoch", "10", "--workers", "2", "--checkpoint-dir",
        str(checkpoints))]
    first = subprocess.Popen(argv, env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             text=True)
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(first.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        victim = None
        while time.monotonic() < deadline and first.poll() is None:
            log = checkpoints / "epochs.jsonl"
            if victim is None:
                found = re.search(r"started worker 1 of 2 \(pid (\d+)\)", "".join(stderr))
                victim = int(found.group(1)) if found else None
            # An epoch's log line is written before its checkpoint: 3 lines mean epoch 2 is
            # saved, what resumed_at_epoch >= 3 below needs.
            if victim and log.exists() and len(log.read_text().splitlines()) >= 3:
                os.kill(victim, signal.SIGKILL)
                break
            time.sleep(0.1)
        first.wait(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
        reader.join(timeout=10)
    assert first.returncode != 0, "the run finished before a worker could be killed"
    assert "worker 1 was killed by SIGKILL; stopped the other workers" in "".join(stderr)
    assert not (tmp_path / "out" / "metadata.json").exists()

    second = subprocess.run(argv, env=_env(), capture_output=True, text=True,
                            timeout=WORKER_TIMEOUT_S)
    assert second.returncode == 0, second.stderr[-3000:]
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["resumed"] and meta["resumed_at_epoch"] >= 3
    assert meta["checkpoint"]["resumed_at_step"] >= 2 * meta["steps_per_epoch"]
    assert [e["epoch"] for e in meta["epochs"]] == list(range(1, 7))
    assert meta["distribution"]["weights_identical_on_all_workers"] is True
    shas = re.findall(r"\[worker (\d)\] .*final weights sha256 ([0-9a-f]{64})", second.stderr)
    assert sorted(shas) == [("0", meta["weights_sha256"]), ("1", meta["weights_sha256"])], (
        second.stderr[-3000:])
    assert not (checkpoints / "backup").exists()


@pytest.mark.slow
def test_survivor_of_a_killed_peer_exits_with_the_retryable_code(prepared_digits, tmp_path):
    """Started by hand (as in a TFJob, no launcher to stop it): when worker 1 is SIGKILLed,
    worker 0 fails within seconds with exit 138, which TFJob's ExitCode policy restarts."""
    checkpoints = tmp_path / "durable"
    procs = _start_by_hand(_train_args(prepared_digits, tmp_path / "out", "--precision",
                                       "float32", "--batch-size", "16", "--epochs", "40",
                                       "--steps-per-epoch", "10",
                                       "--checkpoint-dir", str(checkpoints)))
    try:
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        log = checkpoints / "epochs.jsonl"
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            if log.exists() and len(log.read_text().splitlines()) >= 2:
                break
            time.sleep(0.1)
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        output = procs[0].communicate(timeout=120)[0]
        noticed_after = time.monotonic() - killed_at
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert procs[0].returncode == 138, output[-3000:]
    assert noticed_after < 60
    assert "ampflow train: error: lost contact with another worker" in output
    assert (checkpoints / "backup").is_dir()  # what the restarted job resumes from
