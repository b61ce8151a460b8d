"""`ampflow compile | submit | run-local | demo`: thin shells over pipeline/."""

from __future__ import annotations

import argparse

from ampflow.cliutil import (
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


def _non_flag_fields() -> tuple[str, ...]:
    """PipelineOptions fields that are Python-only (no help), and the image (added apart)."""
    import dataclasses

    from ampflow.pipeline.pipeline import PipelineOptions, cli_fields

    return ("image", *(f.name for f in dataclasses.fields(PipelineOptions)
                       if f.name not in cli_fields()))


def _add_image_flag(parser: argparse.ArgumentParser) -> None:
    """`--image`: required unless $AMPFLOW_IMAGE names one (there is no public default)."""
    from ampflow.pipeline.pipeline import PipelineOptions
    from ampflow.pipeline.settings import IMAGE_ENV, configured_image

    text = PipelineOptions.__dataclass_fields__["image"].metadata["help"]
    configured = configured_image()
    parser.add_argument("--image", default=configured, metavar="REF",
                        help=text + (f" (default: ${IMAGE_ENV}, {configured})" if configured
                                     else ""))


def _image_of(args) -> str:
    from ampflow.errors import ConfigError
    from ampflow.pipeline.settings import IMAGE_ENV

    if not args.image:
        raise ConfigError(
            "--image is required: the image every step runs in, built from the Dockerfile "
            "and pushed where the cluster pulls from (docker build -t REGISTRY/ampflow:TAG . "
            f"&& docker push REGISTRY/ampflow:TAG), or set ${IMAGE_ENV}")
    return args.image


def _register_compile(subparsers) -> None:
    from ampflow.pipeline.pipeline import PipelineOptions

    p = subparsers.add_parser(
        "compile", help="Compile the pipeline to KFP IR YAML.",
        description="Compile the pipeline to KFP IR YAML for a cluster: its image, GPUs, node "
                    "placement and resources are fixed here; what changes per run (dataset, "
                    "model, epochs, ...) is a pipeline parameter (see `ampflow submit --help`).")
    p.add_argument("--output", default="ampflow_pipeline.yaml", metavar="PATH",
                   help="IR YAML file to write.")
    _add_image_flag(p)
    add_config_arguments(p, PipelineOptions, exclude=_non_flag_fields())
    p.add_argument("--kfp-backend", default="2.17", choices=("2.15", "2.16", "2.17"),
                   help="The KFP backend version the file is for: its rules are checked "
                   "(2.15 and 2.16 need --workspace-storage-class, or --checkpoints none).")

    def run(args) -> int:
        from ampflow.pipeline.pipeline import compile_pipeline

        options = config_from_args(PipelineOptions, args, image=_image_of(args))
        base_model = options.check_base_model_for_cluster()  # before anything is written
        weights = options.check_weights_for_cluster()
        path = compile_pipeline(args.output, options)
        _check_for_backend(path, args.kfp_backend)
        print_summary("ampflow compile: done", {
            "pipeline": path, "image": options.image, "gpu": options.gpu,
            "float32_baseline": options.with_float32_baseline,
            "checkpoints": options.checkpoints, "train_workers": options.train_workers,
            **({"base_model": base_model} if base_model else {}),
            **({"weights": weights} if weights else {}),
            **({"pretrain_epochs": options.pretrain_epochs} if options.pretrain_epochs else {})})
        return 0

    p.set_defaults(func=run)


def _check_for_backend(path: str, backend: str) -> None:
    """Refuse (one line per rule) an IR that KFP `backend` would reject when the run starts."""
    from ampflow.errors import ConfigError
    from ampflow.pipeline.backend_rules import ir_problems

    problems = ir_problems(path, backend)
    if problems:
        raise ConfigError(f"KFP {backend} would refuse {path}: " + "; ".join(problems) + (
            "; pass --workspace-storage-class NAME (kubectl get storageclass) or --checkpoints "
            "none" if backend in ("2.15", "2.16") else ""))


def _register_submit(subparsers) -> None:
    from ampflow.pipeline.parameters import describe_parameters
    from ampflow.pipeline.submit import SubmitConfig

    p = subparsers.add_parser("submit", help="Compile and submit the pipeline to a KFP endpoint.",
                              description="Compile the pipeline (the same flags as `ampflow "
                              "compile`) and submit a run of it to a KFP endpoint, after "
                              "checking the endpoint and the cluster's prerequisites.",
                              formatter_class=HelpFormatterKeepingEpilog,
                              epilog=describe_parameters())
    _add_image_flag(p)
    add_config_arguments(p, SubmitConfig, exclude=_non_flag_fields())
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="A pipeline parameter (repeatable, listed below), e.g. --param "
                   "epochs=20; an unknown name or a value of the wrong type is refused before "
                   "anything is compiled or sent.")

    def run(args) -> int:
        from ampflow.pipeline.parameters import check_arguments, parse_param
        from ampflow.pipeline.submit import submit

        arguments = dict(parse_param(text) for text in args.param)
        # before anything else, a misspelt run is refused first; `args` holds the options it
        # is checked with (a base model: --base-model-uri, --pretrain-epochs) by their names
        check_arguments(arguments, args)
        result = submit(config_from_args(SubmitConfig, args, image=_image_of(args)), arguments)
        print_summary("ampflow submit: done", {"run_id": result.run_id, "url": result.url})
        return 0

    p.set_defaults(func=run)


def _register_run_local(subparsers) -> None:
    from ampflow.pipeline.run_local import LocalRunConfig

    p = subparsers.add_parser(
        "run-local", help="Run the whole pipeline with the kfp local runner.",
        description="Run the whole pipeline on this machine with the kfp local runner (each "
                    "step a subprocess, no image, no cluster): one line per step as it starts "
                    "and ends, each step's log in <workdir>/logs/, the results table at the end.")
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


# The demo queries images and pretraining needs texts: the flag could only be refused. It is
# kept (hidden) so that giving it gets that refusal's own line, not a "did you mean" guess.
DEMO_HIDDEN_FIELDS = ("pretrain_epochs",)


def _hide_from_help(parser, fields: tuple[str, ...]) -> None:
    for action in parser._actions:
        if action.dest in fields:
            action.help = argparse.SUPPRESS


def _register_demo(subparsers) -> None:
    from ampflow.pipeline.demo import DemoConfig

    p = subparsers.add_parser(
        "demo", help="The whole mission locally: pipeline, then serve and query over gRPC.",
        description="Run the whole pipeline locally (as run-local), then serve the exported "
                    "model with `ampflow serve` and query it over gRPC: predictions and a "
                    "results table (<workdir>/results.txt and .json).")
    add_config_arguments(p, DemoConfig)
    _hide_from_help(p, DEMO_HIDDEN_FIELDS)
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

