"""Multi-worker training: TF_CONFIG, the local launcher, agreement across replicas, resume.

The slow tests start real worker processes on loopback (2 workers, the small CNN, a few dozen
steps) with MultiWorkerMirroredStrategy, exactly as a TFJob would; each is bounded by a timeout.
A worker process costs more to start than its small job (see "real workers" below), so several
tests read the outputs of one run of a module-scoped fixture.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from ampflow.components.train import TrainConfig, run_train
from ampflow.components.train.clusters.launcher import (
    WorkerFailedError,
    _wait,
    config_to_argv,
    local_ports,
    run_workers,
    tf_configs,
)
from ampflow.components.train.clusters.tf_config import (
    PEER_LOST_EXIT_CODE,
    choose_strategy,
    parse_tf_config,
    read_tf_config,
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
# Starting a worker costs ~9 CPU-s (TensorFlow's import and runtime), more than a small job: so
# every job here but the launcher's runs on ONE pair of worker processes started by hand, one
# job after the other (worker_driver.py's `--then`: each job gets a fresh TensorFlow context
# and its own environment). The cluster jobs get a TF_CONFIG on fresh loopback ports; the jobs
# that run alone (the one-process references, the two MirroredStrategy jobs on two logical
# CPUs) get none, one on each worker at once. Each test reads its job's part of the output.
# The float32 job runs first, in fresh processes, as a TFJob's pods start; then mixed_float16
# (loss scaling, XLA); the interrupted job runs last (its worker 1 is killed). No
# mixed_bfloat16 job (~18 CPU-s with its one-process run): its distributed step is float32's
# (no loss scaling, no XLA on a CPU, float32 gradients all-reduced), so it proved nothing the
# float32 job does not; bfloat16 on two real workers is test_scaling_options.py's (one step:
# Keras's all-reduce's bits, identical workers; and two accumulated steps equal to one
# process's on the larger batch). The local launcher runs the restart of the interrupted job
# and one whose worker is killed (and tests/components/train/test_text_buckets_train.py's
# accumulating job): the mixed_float16 job ran on it too, in three processes of its own, for
# no claim of the launcher's that those runs do not make.

_DONE = re.compile(r"^worker_driver: command (\d+) exited with code (-?\d+)$", re.MULTILINE)


def _jobs_argv(jobs: list[list[str]]) -> list[str]:
    argv = list(jobs[0])
    for job in jobs[1:]:
        argv += ["--then", *job]
    return argv


def _split_jobs(output: str) -> tuple[list[str], list[int | None]]:
    """Each job's part of a driver's output and its exit code (None: the job never ended)."""
    parts, codes, begin = [], [], 0
    for done in _DONE.finditer(output):
        parts.append(output[begin:done.start()])
        codes.append(int(done.group(2)))
        begin = done.end()
    return parts + [output[begin:]], codes + [None]


def _ports_kept_free(count: int) -> list[int]:
    """`count` free loopback ports below the kernel's ephemeral range: chosen now for a job
    that starts minutes later, they must not be handed to someone's bind(0) or connect()
    meanwhile, as a free port of that range can be."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    while True:
        first = rng.randrange(max(1024, low - 12000), low - count)
        try:
            return local_ports(count, first)
        except ConfigError:  # one of them is in use: another draw
            continue


class _Alone(NamedTuple):
    """A job each worker process runs on its own, not as a cluster (`args[i]` on worker i):
    no TF_CONFIG, the CPU split into `logical_cpus` devices (2: MirroredStrategy's replicas)."""

    args: list[list[str]]
    logical_cpus: int = 1


def _job_env(job: _Alone | list[dict], index: int) -> dict[str, str | None]:
    """Worker `index`'s environment for one job: its TF_CONFIG (`job`: one per worker), or
    none and the CPU split of a job that runs alone (None: the variable is removed)."""
    if isinstance(job, _Alone):
        split = str(job.logical_cpus) if job.logical_cpus > 1 else None
        return {"TF_CONFIG": None, "AMPFLOW_TEST_LOGICAL_CPUS": split}
    return {"TF_CONFIG": json.dumps(job[index]), "AMPFLOW_TEST_LOGICAL_CPUS": None}


class _ByHand:
    """Worker processes started the way a TFJob does: the same command, each with its
    TF_CONFIG (one per cluster job, on fresh ports); their output is read as it comes."""

    def __init__(self, jobs: list[list[str] | _Alone], count: int = 2):
        per_job = [job if isinstance(job, _Alone) else tf_configs(_ports_kept_free(count))
                   for job in jobs]
        self.procs, self.lines, self.readers = [], [], []
        for index in range(count):
            own = [job.args[index] if isinstance(job, _Alone) else job for job in jobs]
            envs = [_job_env(job, index) for job in per_job]
            env = _env(**{k: v for k, v in envs[0].items() if v is not None},
                       AMPFLOW_TEST_JOB_ENVS=json.dumps(envs))
            proc = subprocess.Popen(_cli(*_jobs_argv(own)), env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            lines: list[str] = []
            reader = threading.Thread(target=lambda p=proc, out=lines: out.extend(p.stdout),
                                      daemon=True)
            reader.start()
            self.procs.append(proc)
            self.lines.append(lines)
            self.readers.append(reader)

    def output(self, index: int) -> str:
        return "".join(self.lines[index])

    def kill(self) -> None:
        """Kill whoever is left; then every pipe is read to its end."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for reader in self.readers:
            reader.join(timeout=10)


def _sha(output: str) -> str:
    return re.search(r"final weights sha256 ([0-9a-f]{64})", output).group(1)


def _one_process_args(data_dir, root, policies) -> list[list[str]]:
    """The reference each cluster job's loss is compared with: one process on the cluster's
    global batch (2 × 16), the same steps and seed (`policies[i]`'s on worker i)."""
    return [_train_args(data_dir, root / policy, "--precision", policy, "--batch-size", "32",
                        "--epochs", "2", "--steps-per-epoch", "20") for policy in policies]


def _resumable_args(data_dir, out, checkpoints) -> list[str]:
    """The interrupted job: a user's builder with BatchNormalization (each worker updates its
    moving statistics from its own shard; they are averaged before evaluation, checkpoints and
    the save, so both workers end identical, resumed statistics included: the weights hash
    covers them too)."""
    return _train_args(data_dir, out, "--model", "worker_driver:batch_norm_cnn", "--model-path",
                       str(DRIVER.parent), "--precision", "float32", "--batch-size", "16",
                       "--epochs", "6", "--steps-per-epoch", "10", "--checkpoint-dir",
                       str(checkpoints))


_BY_HAND_POLICIES = ("float32", "mixed_float16")
# The jobs with inf gradients on one replica prove the agreed skip verdict, taken outside XLA
# either way; XLA on workers is the mixed_float16 job's claim. Off, each process saves an XLA
# compile (~1.6 CPU-s measured for the mirrored one).
_NO_XLA = ("--xla", "off")
# Whichever test asks for `by_hand` first pays for its six jobs (the fixture waits up to
# 2 × WORKER_TIMEOUT_S for the kill point and 120 s more for the survivor), then its own call
# (the restart: up to WORKER_TIMEOUT_S): pyproject's 600 s per test would stop it before the
# fixture's own deadlines could say what hung.
BY_HAND_TEST_TIMEOUT_S = 3 * WORKER_TIMEOUT_S + 180
_JOB = {"float32": 0, "mixed_float16": 1, "inf": 2, "one_process": 3, "mirrored": 4,
        "killed": 5}
# The one-process references, one on each worker at once: the longer one (XLA) on worker 0,
# whose MirroredStrategy job is the shorter one.
_ONE_PROCESS_ON_WORKER = ("mixed_float16", "float32")


@pytest.fixture(scope="module")
def by_hand(tmp_path_factory, prepared_digits) -> dict:
    """Six jobs on one pair of workers started by hand: float32 and mixed_float16 to the
    end, infinite gradients on worker 1 only, their one-process references and the
    MirroredStrategy jobs (each worker runs one of each alone), then a job whose worker 1 is
    SIGKILLed once epoch 2 is saved (`_JOB` numbers them)."""
    root = tmp_path_factory.mktemp("by-hand")
    dirs = {policy: root / policy for policy in _BY_HAND_POLICIES}
    dirs.update(inf=root / "inf", killed=root / "killed", checkpoints=root / "durable",
                mirrored=root / "mirrored", one_process=root / "one-process")
    jobs = [
        *(_train_args(prepared_digits, dirs[policy], "--precision", policy, "--batch-size", "16",
                      "--epochs", "2", "--steps-per-epoch", "20")
          for policy in _BY_HAND_POLICIES),
        _train_args(prepared_digits, dirs["inf"], "--model", "test_inf_gradient_on_replica_1",
                    "--precision", "mixed_float16", *_NO_XLA, "--batch-size", "16", "--epochs",
                    "10", "--steps-per-epoch", "4", "--guard-warmup-steps", "1000"),
        _Alone(_one_process_args(prepared_digits, dirs["one_process"], _ONE_PROCESS_ON_WORKER)),
        _Alone(_mirrored_args(prepared_digits, dirs["mirrored"]), logical_cpus=2),
        _resumable_args(prepared_digits, dirs["killed"], dirs["checkpoints"]),
    ]
    workers = _ByHand(jobs)
    log = dirs["checkpoints"] / "epochs.jsonl"
    noticed_after = None
    try:
        deadline = time.monotonic() + 2 * WORKER_TIMEOUT_S
        while time.monotonic() < deadline and all(p.poll() is None for p in workers.procs):
            # An epoch's log line is written before its checkpoint: 3 lines mean epoch 2 is
            # saved, what the restart's resumed_at_epoch >= 3 needs.
            if log.exists() and len(log.read_text().splitlines()) >= 3:
                break
            time.sleep(0.1)
        epochs_logged_at_kill = len(log.read_text().splitlines()) if log.exists() else 0
        workers.procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        try:
            workers.procs[0].wait(timeout=120)
            noticed_after = time.monotonic() - killed_at
        except subprocess.TimeoutExpired:  # the survivor test says so, with its output
            pass
    finally:
        workers.kill()
    split = [_split_jobs(workers.output(i)) for i in (0, 1)]
    return {
        "dirs": dirs, "jobs": jobs, "codes": [p.returncode for p in workers.procs],
        "outputs": [parts for parts, _ in split], "job_codes": [codes for _, codes in split],
        "noticed_after": noticed_after, "epochs_logged_at_kill": epochs_logged_at_kill,
        "backup_after_kill": (dirs["checkpoints"] / "backup").is_dir(),
        "published_after_kill": (dirs["killed"] / "metadata.json").exists()}


def _job(by_hand: dict, index: int) -> tuple[list[int | None], list[str]]:
    """(exit codes, outputs) of job `index` on each worker."""
    return ([codes[index] for codes in by_hand["job_codes"]],
            [parts[index] for parts in by_hand["outputs"]])


@pytest.mark.slow
@pytest.mark.timeout(BY_HAND_TEST_TIMEOUT_S)
@pytest.mark.parametrize("policy", _BY_HAND_POLICIES)
def test_two_workers_started_by_hand_match_one_process(policy, by_hand, prepared_digits):
    """Two processes with TF_CONFIG (as a TFJob starts them): identical weights on both,
    only the chief published, the same loss as one process with the same global batch."""
    codes, outputs = _job(by_hand, _JOB[policy])
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    out = by_hand["dirs"][policy]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["precision"]["policy"] == policy
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
    codes, outputs = _job(by_hand, _JOB["one_process"])
    worker = _ONE_PROCESS_ON_WORKER.index(policy)
    assert codes[worker] == 0, outputs[worker][-3000:]
    single = json.loads((by_hand["dirs"]["one_process"] / policy / "metadata.json").read_text())
    assert abs(meta["final_metrics"]["loss"] - single["final_metrics"]["loss"]) < LOSS_TOLERANCE


@pytest.mark.slow
@pytest.mark.timeout(BY_HAND_TEST_TIMEOUT_S)
def test_two_workers_under_mixed_float16_scale_the_loss_with_the_all_reduce_outside_xla(
        by_hand):
    """mixed_float16 on two workers: loss scaling and XLA on, the collectives outside XLA
    (identical workers and the same loss as one process: the test above, its third case)."""
    codes, outputs = _job(by_hand, _JOB["mixed_float16"])
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    meta = json.loads((by_hand["dirs"]["mixed_float16"] / "metadata.json").read_text())
    assert meta["loss_scale"]["enabled"] and meta["xla"]["effective"]
    assert "all-reduce and the optimizer update run outside XLA" in meta["xla"]["scope"]


@pytest.mark.slow
@pytest.mark.timeout(BY_HAND_TEST_TIMEOUT_S)
def test_infinite_gradients_on_one_worker_only_make_every_worker_skip_and_stop(by_hand):
    """Keras's LossScaleOptimizer decides "skip" on each worker's local gradients: without an
    agreement the worker with inf gradients skips while the other waits in the all-reduce
    (a hang). With it, both skip every step and the scale-floor guard stops both, together."""
    codes, outputs = _job(by_hand, _JOB["inf"])
    assert codes == [1, 1], outputs[0][-3000:] + outputs[1][-3000:]
    for output in outputs:
        assert "loss scale fell to 0.5, below the floor 1" in output
        assert "at step 16 (16 steps skipped" in output
    assert not (by_hand["dirs"]["inf"] / "metadata.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(BY_HAND_TEST_TIMEOUT_S)
def test_survivor_of_a_killed_peer_exits_with_the_retryable_code(by_hand):
    """Started by hand (as in a TFJob, no launcher to stop it): when worker 1 is SIGKILLed,
    worker 0 fails within seconds with exit 138, which TFJob's ExitCode policy restarts."""
    codes, outputs = _job(by_hand, _JOB["killed"])
    assert by_hand["epochs_logged_at_kill"] >= 3, outputs[0][-3000:]
    assert codes[0] == by_hand["codes"][0] == 138, outputs[0][-3000:]
    assert by_hand["noticed_after"] is not None and by_hand["noticed_after"] < 60
    assert "ampflow train: error: lost contact with another worker" in outputs[0]
    assert by_hand["backup_after_kill"]  # what the restarted job resumes from
    assert not by_hand["published_after_kill"]


@pytest.mark.slow
@pytest.mark.timeout(BY_HAND_TEST_TIMEOUT_S)
def test_restart_of_a_killed_job_resumes_and_finishes_with_identical_workers(by_hand):
    """The rerun of the killed job with the same flags (a TFJob restart; here by the local
    launcher) resumes from the durable checkpoint dir and finishes the planned epochs."""
    argv = [sys.executable, "-m", "ampflow.cli", *by_hand["jobs"][_JOB["killed"]], "--workers", "2"]
    restart = subprocess.run(argv, env=_env(), capture_output=True, text=True,
                             timeout=WORKER_TIMEOUT_S)
    assert restart.returncode == 0, restart.stderr[-3000:]
    meta = json.loads((by_hand["dirs"]["killed"] / "metadata.json").read_text())
    assert meta["resumed"] and meta["resumed_at_epoch"] >= 3
    assert meta["checkpoint"]["resumed_at_step"] >= 2 * meta["steps_per_epoch"]
    assert [e["epoch"] for e in meta["epochs"]] == list(range(1, 7))
    assert meta["distribution"]["num_workers"] == 2
    assert meta["distribution"]["weights_identical_on_all_workers"] is True
    shas = re.findall(r"\[worker (\d)\] .*final weights sha256 ([0-9a-f]{64})", restart.stderr)
    assert sorted(shas) == [("0", meta["weights_sha256"]), ("1", meta["weights_sha256"])], (
        restart.stderr[-3000:])
    assert not (by_hand["dirs"]["checkpoints"] / "backup").exists()


def _is_running(pid: int) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
def test_launcher_stops_every_worker_when_one_is_killed_with_sigkill(prepared_digits, tmp_path):
    """`ampflow train --workers 2`, worker 1 SIGKILLed: the launcher stops worker 0 at once,
    names worker 1 and its signal, exits non-zero and publishes nothing.

    Worker 1 is killed as soon as the launcher says it started: the launcher watches processes,
    not training, so the moment does not matter to what it must do, and the job costs no
    TensorFlow start-up (the restart of a job killed mid-training: the tests above)."""
    argv = [sys.executable, "-m", "ampflow.cli", *_resumable_args(
        prepared_digits, tmp_path / "out", tmp_path / "durable"), "--workers", "2"]
    launcher = subprocess.Popen(argv, env=_env(), stderr=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, text=True)
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(launcher.stderr), daemon=True)
    reader.start()
    pids: dict[int, int] = {}
    try:
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        while time.monotonic() < deadline and launcher.poll() is None and 1 not in pids:
            pids = {int(index): int(pid) for index, pid in re.findall(
                r"started worker (\d) of 2 \(pid (\d+)\)", "".join(stderr))}
            time.sleep(0.05)
        assert 1 in pids, "".join(stderr)[-3000:]
        os.kill(pids[1], signal.SIGKILL)
        launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        reader.join(timeout=10)
    assert launcher.returncode != 0
    assert "worker 1 was killed by SIGKILL; stopped the other workers" in "".join(stderr)
    assert not _is_running(pids[0])  # stopped, not left behind
    assert not (tmp_path / "out" / "metadata.json").exists()


# ---- MirroredStrategy: two replicas in one process -------------------------------------------
# Its two jobs run in the by-hand workers' processes, one each, at the same time, between
# their cluster jobs: a fresh TensorFlow context on two logical CPUs and no TF_CONFIG (the
# driver's per-job environment), so no process of their own pays TensorFlow's start-up.

def _mirrored_args(data_dir, root) -> list[list[str]]:
    """Worker 0's job: a BatchNormalization model trained to the end; worker 1's: a model
    whose gradients are infinite on replica 1 only."""
    return [
        _train_args(data_dir, root / "batch-norm", "--strategy", "mirrored",
                    "--precision", "float32", "--batch-size", "16", "--epochs", "2",
                    "--steps-per-epoch", "5", "--model", "test_batch_norm_cnn"),
        _train_args(data_dir, root / "inf", "--strategy", "mirrored",
                    "--model", "test_inf_gradient_on_replica_1", "--precision", "mixed_float16",
                    *_NO_XLA, "--batch-size", "16", "--epochs", "10", "--steps-per-epoch", "4",
                    "--guard-warmup-steps", "1000"),
    ]


@pytest.mark.slow
@pytest.mark.timeout(BY_HAND_TEST_TIMEOUT_S)
def test_mirrored_strategy_with_inf_gradients_on_one_replica_skips_instead_of_nan(by_hand):
    """MirroredStrategy: Keras takes replica 0's verdict only, so replica 1's inf would be
    averaged into the weights (NaN). The agreed verdict makes both replicas skip."""
    codes, outputs = _job(by_hand, _JOB["mirrored"])
    stderr = outputs[1]
    assert codes[1] == 1, stderr[-3000:]
    assert "loss scale fell to 0.5, below the floor 1" in stderr
    assert "loss became non-finite" not in stderr


@pytest.mark.slow
@pytest.mark.timeout(BY_HAND_TEST_TIMEOUT_S)
def test_mirrored_strategy_two_replicas_in_one_process_train_and_publish(by_hand):
    """A BatchNormalization model (whose moving statistics each replica updates) on two
    logical CPUs: trains, averages the statistics, publishes one model."""
    codes, outputs = _job(by_hand, _JOB["mirrored"])
    assert codes[0] == 0, outputs[0][-3000:]
    meta = json.loads((by_hand["dirs"]["mirrored"] / "batch-norm" / "metadata.json").read_text())
    assert (meta["distribution"]["strategy"], meta["distribution"]["num_replicas"],
            meta["distribution"]["num_workers"]) == ("mirrored", 2, 1)
    assert meta["distribution"]["global_batch_size"] == 32
