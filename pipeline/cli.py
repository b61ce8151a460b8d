"""`ampflow compile | submit | run-local | demo`: thin shells over pipeline/."""

from __future__ import annotations

import argparse

from ampflow.cliutil import (
    HelpFormatter,
    HelpFormatterKeepingEpilog,
    add_config_arguments,
    config_from_args,
    print_summary,
)


def register(subparsers) -> None:
    """Add the pipeline subcommands."""
    _register_compile(subparsers)
    _register_submit(subparsers)
    _register_run_local(subparsers)
    _register_demo(subparsers)


def _register_compile(subparsers) -> None:
    from ampflow.pipeline.settings import DEFAULT_IMAGE

    p = subparsers.add_parser("compile", help="Compile the pipeline to KFP IR YAML.",
                              formatter_class=HelpFormatter)
    p.add_argument("--output", default="ampflow_pipeline.yaml", help="IR YAML path to write.")
    p.add_argument("--image", default=DEFAULT_IMAGE, help="Image every step runs in.")
    p.add_argument("--gpu", action=argparse.BooleanOptionalAction, default=True,
                   help="Request a GPU (accelerator, node selector, toleration) for training.")
    p.add_argument("--accelerator-type", default="nvidia.com/gpu", help="GPU resource name.")
    p.add_argument("--with-float32-baseline", action=argparse.BooleanOptionalAction,
                   default=True, help="Train a float32 baseline in parallel with the AMP model: "
                   "the gate then also compares AMP-trained with float32-trained accuracy.")
    p.add_argument("--checkpoints", choices=("workspace", "none"), default="workspace",
                   help="Where a train task keeps its resumable checkpoint: the run's KFP "
                   "workspace PVC (a retried pod resumes; KFP backend >= 2.15) or none.")
    p.add_argument("--workspace-size", default="20Gi", help="Size of the run's workspace PVC.")
    p.add_argument("--workspace-storage-class", default=None,
                   help="Storage class of the workspace PVC (default: the cluster's default "
                   "class; a KFP 2.15/2.16 backend refuses the run without one named).")
    p.add_argument("--workspace-access-mode", default="ReadWriteOnce",
                   choices=("ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"),
                   help="Access mode of the workspace PVC (a KFP backend refuses the run "
                   "without one); ReadWriteMany lets the two train tasks run on different "
                   "nodes at once.")
    p.add_argument("--serving-namespace", default=None,
                   help="Namespace the deploy task deploys TF Serving into (default: the "
                   "run's own, with the model-store claim there; another namespace mounts no "
                   "claim and needs serving_model_store=gs://...).")
    p.add_argument("--kfp-backend", default="2.17", choices=("2.15", "2.16", "2.17"),
                   help="The KFP backend version the file is for: its rules are checked "
                   "(2.15 and 2.16 need --workspace-storage-class, or --checkpoints none).")
    p.add_argument("--train-workers", type=int, default=1,
                   help="> 1: the AMP train task runs a TFJob with this many workers "
                   "(checkpoints on the training claim, not the workspace).")
    p.add_argument("--base-model-uri", default=None,
                   help="Fine-tune this trained .keras file (or model dir) instead of building "
                   "`model`: a URI the cluster's launcher fetches (gs://, s3://, minio://), "
                   "brought in with dsl.importer.")

    def run(args) -> int:
        from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline

        options = PipelineOptions(image=args.image, gpu=args.gpu,
                                  accelerator_type=args.accelerator_type,
                                  with_float32_baseline=args.with_float32_baseline,
                                  checkpoints=args.checkpoints,
                                  workspace_size=args.workspace_size,
                                  workspace_storage_class=args.workspace_storage_class,
                                  workspace_access_mode=args.workspace_access_mode,
                                  train_workers=args.train_workers,
                                  base_model_uri=args.base_model_uri,
                                  serving_namespace=args.serving_namespace,
                                  # another namespace's claim cannot be mounted: gs:// there
                                  **({"model_store_pvc": None} if args.serving_namespace
                                     else {}))
        path = compile_pipeline(args.output, options)
        _check_for_backend(path, args.kfp_backend)
        print_summary("ampflow compile: done", {
            "pipeline": path, "image": args.image, "gpu": args.gpu,
            "float32_baseline": args.with_float32_baseline, "checkpoints": args.checkpoints,
            "train_workers": args.train_workers})
        return 0

    p.set_defaults(func=run)


def _check_for_backend(path: str, backend: str) -> None:
    """Refuse (one line per rule) an IR that KFP `backend` would reject when the run starts."""
    import yaml

    from ampflow.errors import ConfigError
    from ampflow.pipeline.backend_rules import (
        mount_problems,
        placeholder_problems,
        workspace_problems,
    )

    with open(path) as f:
        docs = list(yaml.safe_load_all(f))
    platform = docs[1] if len(docs) > 1 else {}
    problems = (placeholder_problems(docs[0]) + mount_problems(platform)
                + workspace_problems(platform, backend))
    if problems:
        raise ConfigError(f"KFP {backend} would refuse {path}: " + "; ".join(problems) + (
            "; pass --workspace-storage-class NAME (kubectl get storageclass) or --checkpoints "
            "none" if backend in ("2.15", "2.16") else ""))


def _register_submit(subparsers) -> None:
    from ampflow.pipeline.parameters import describe_parameters
    from ampflow.pipeline.submit import SubmitConfig

    p = subparsers.add_parser("submit", help="Compile and submit the pipeline to a KFP endpoint.",
                              description="Compile and submit the pipeline to a KFP endpoint.",
                              formatter_class=HelpFormatterKeepingEpilog,
                              epilog=describe_parameters())
    add_config_arguments(p, SubmitConfig)
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="A pipeline parameter (repeatable, listed below), e.g. --param "
                   "epochs=20; an unknown name or a value of the wrong type is refused before "
                   "anything is compiled or sent.")

    def run(args) -> int:
        from ampflow.pipeline.parameters import parse_param
        from ampflow.pipeline.submit import submit

        arguments = dict(parse_param(text) for text in args.param)
        result = submit(config_from_args(SubmitConfig, args), arguments)
        print_summary("ampflow submit: done", {"run_id": result.run_id, "url": result.url})
        return 0

    p.set_defaults(func=run)


def _register_run_local(subparsers) -> None:
    from ampflow.pipeline.run_local import LocalRunConfig

    p = subparsers.add_parser("run-local", help="Run the whole pipeline with the kfp local runner.",
                              formatter_class=HelpFormatter)
    add_config_arguments(p, LocalRunConfig)
    _add_verbose(p)

    def run(args) -> int:
        from ampflow.pipeline.report import results, save_results, summarize_run
        from ampflow.pipeline.run_local import run_local

        config = config_from_args(LocalRunConfig, args)
        result = run_local(config, verbose=args.verbose)
        print(summarize_run(result))
        text = save_results(config.workdir, result, results(result), result.logs)
        print(f"\nSaved as {text} and {text.with_suffix('.json')}; full logs, one per step: "
              f"{config.log_dir}/<step>.log")
        return 0

    p.set_defaults(func=run)


def _register_demo(subparsers) -> None:
    from ampflow.pipeline.demo import DemoConfig

    p = subparsers.add_parser(
        "demo", formatter_class=HelpFormatter,
        help="The whole mission locally: pipeline, then serve and query over gRPC.")
    add_config_arguments(p, DemoConfig)
    _add_verbose(p)

    def run(args) -> int:
        from ampflow.pipeline.demo import run_demo

        run_demo(config_from_args(DemoConfig, args), verbose=args.verbose)
        return 0

    p.set_defaults(func=run)


def _add_verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", action="store_true",
                        help="Stream every step's full output (the local runner's executor "
                             "logs, TensorFlow's start-up lines) as well as writing it to "
                             "<workdir>/logs/<step>.log.")

