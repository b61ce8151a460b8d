"""The `ampflow` command line as a new user meets it: `--help` of every command.

The parsers are built in this process, in a clean import state: every `ampflow` module and
every heavy framework is taken out of `sys.modules` for the build (and put back after), and an
import hook refuses TensorFlow, Keras, TFDS and kfp. So `--help` staying fast is checked by
what it imports (the honest, machine-independent part), not by a timing.
"""

from __future__ import annotations

import argparse
import importlib.abc
import io
import os
import re
import subprocess
import sys

import pytest

from ampflow.cli import write_whole_lines
from ampflow.modeling.models import model_names

# An architecture other than the default, named without spelling it out (a large model's name
# in a test's source marks it as training one: tests/test_suite_hygiene.py).
OTHER = next(name for name in model_names() if name != "small_cnn")
HEAVY = ("tensorflow", "keras", "tensorflow_datasets", "kfp", "tf_keras", "sklearn",
         "matplotlib", "tensorflow_serving", "grpc", "kubernetes")


class _RefuseHeavyImports(importlib.abc.MetaPathFinder):
    """Records and refuses any import of a heavy framework."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102
        if fullname.split(".")[0] in HEAVY:
            self.refused.append(fullname)
            raise ImportError(f"test_cli: {fullname} imported while building the CLI parser")
        return None


def _is_isolated(name: str) -> bool:
    return name.split(".")[0] in ("ampflow", *HEAVY)


@pytest.fixture(scope="module")
def cli():
    """`(parser, {command: subparser}, refused imports)`, built with no heavy module loaded."""
    saved = dict(sys.modules)
    guard = _RefuseHeavyImports()
    for name in [n for n in sys.modules if _is_isolated(n)]:
        del sys.modules[name]
    sys.meta_path.insert(0, guard)
    try:
        from ampflow.cli import build_parser

        parser = build_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands = dict(sub.choices)
        help_texts = {"": parser.format_help()}
        help_texts.update({name: p.format_help() for name, p in commands.items()})
        loaded = sorted(n for n in sys.modules if n.split(".")[0] in HEAVY)
    finally:
        sys.meta_path.remove(guard)
        for name in [n for n in sys.modules if _is_isolated(n)]:
            del sys.modules[name]  # the fresh copies; other new modules (numpy) stay loaded
        sys.modules.update(saved)
    return {"parser": parser, "commands": commands, "help": help_texts,
            "refused": guard.refused, "loaded": loaded}


def test_help_of_every_command_imports_no_heavy_framework(cli):
    # `ampflow --help` took 9-25 s when building the parser imported TensorFlow.
    assert cli["refused"] == [] and cli["loaded"] == []
    assert set(cli["commands"]) >= {"prepare-data", "train", "evaluate", "export", "convert",
                                    "serve", "predict", "deploy", "compile", "submit",
                                    "run-local", "demo"}


def _option_blocks(help_text: str) -> list[str]:
    """Each option's entry (its line and the wrapped lines under it), joined into one line."""
    options = help_text.split("\noptions:\n", 1)[-1].split("\n\n", 1)[0]
    blocks = re.split(r"\n(?=  -)", options)
    return [" ".join(block.split()) for block in blocks]


def test_no_flag_shows_its_default_twice(cli):
    doubled = [f"{command}: {block}" for command, text in cli["help"].items()
               for block in _option_blocks(text) if block.count("(default") > 1]
    assert doubled == []
    blocks = [b for text in cli["help"].values() for b in _option_blocks(text)]
    assert not [b for b in blocks if "(default: None)" in b or "(default: [])" in b]


def test_train_help_states_the_xla_rule_that_training_applies(cli):
    from ampflow.components.train.precision.policy import HardwareInfo, choose_jit

    text = next(b for b in _option_blocks(cli["help"]["train"]) if b.startswith("--xla"))
    on, off = re.search(r"on a CPU on for ([\w/]+) .* off for ([\w/]+)", text).groups()
    for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
        jit, _reason = choose_jit(None, HardwareInfo(), policy)  # a CPU-only machine
        assert policy in (on if jit else off).split("/"), (policy, jit, text)


def test_one_served_model_name_default_across_every_command(cli):
    from ampflow.components.export_savedmodel.step import ExportConfig
    from ampflow.pipeline.parameters import PIPELINE_PARAMETERS
    from ampflow.serving.model_format import DEFAULT_MODEL_NAME

    commands = cli["commands"]
    for name in ("export", "serve", "predict", "model-metadata", "model-status", "run-local",
                 "demo"):
        defaults = {a.dest: a.default for a in commands[name]._actions}
        assert defaults["model_name"] == DEFAULT_MODEL_NAME == "ampflow", name
    assert PIPELINE_PARAMETERS["model_name"][1] == DEFAULT_MODEL_NAME
    assert [f.default for f in ExportConfig.__dataclass_fields__.values()
            if f.name == "model_name"] == [DEFAULT_MODEL_NAME]
    # `--model` is the architecture wherever a command trains
    for name in ("train", "run-local", "demo"):
        defaults = {a.dest: a.default for a in commands[name]._actions}
        assert defaults["model"] == "small_cnn", name


def test_submit_help_lists_every_pipeline_parameter(cli):
    from ampflow.pipeline.parameters import PIPELINE_PARAMETERS

    listed = cli["help"]["submit"].split("pipeline parameters (--param NAME=VALUE)", 1)[1]
    names = re.findall(r"^  (\w+) ", listed, flags=re.MULTILINE)
    assert names == list(PIPELINE_PARAMETERS)


@pytest.mark.parametrize("param, message", [
    ("epoch=3", r"--param epoch is not a pipeline parameter; did you mean epochs\? "
                r"\(`ampflow submit --help` lists them all\)"),
    ("xla=of", r"--param xla must be one of auto, on, off. Received: 'of'; did you mean off\?"),
    ("precision=fp16", r"--param precision must be one of .*; did you mean mixed_float16\?"),
    ("epochs=many", r"--param epochs must be of type int. Received: 'many'"),
    ("autotune=maybe", r"--param autotune must be of type bool"),
    (f"model_name={OTHER}", rf"model_name is the served model name .*did you mean "
                            rf"model='{OTHER}'"),
    ("model_name=../x", r"model_name must be letters"),
])
def test_submit_bad_param_is_refused_before_any_endpoint_is_contacted(param, message, capsys,
                                                                      monkeypatch):
    import socket

    from ampflow.cli import main

    def no_network(*args, **kwargs):
        raise AssertionError(f"submit contacted {args} before checking --param")

    monkeypatch.setattr(socket, "create_connection", no_network)
    code = main(["submit", "--host", "http://127.0.0.1:9", "--param", param])
    err = capsys.readouterr().err
    assert code == 2 and re.search(message, err), err
    assert "Traceback" not in err


def test_documented_python_clients_import_from_ampflow_serving():
    # README: `from ampflow.serving import PredictionClient` (it failed: not exported).
    from ampflow.serving import PredictionClient, RestClient
    from ampflow.serving.client import PredictionClient as Grpc
    from ampflow.serving.rest_client import RestClient as Rest

    assert (PredictionClient, RestClient) == (Grpc, Rest)


def test_lazy_package_exports_list_what_they_import():
    # The step packages import their names on first use; `__all__`, the run-time table and
    # what each name resolves to must agree (a name missing from one is an ImportError later).
    import importlib

    import ampflow.components.prepare_data as prepare_data
    import ampflow.components.train as train
    import ampflow.serving as serving

    for package in (prepare_data, train, serving):
        assert sorted(package.__all__) == sorted(package._EXPORTS)
        for name, module in package._EXPORTS.items():
            defined_in = importlib.import_module(f"{package.__name__}.{module}")
            assert getattr(package, name) is getattr(defined_in, name)


def test_client_wait_s_gives_up_with_the_last_status_when_nothing_serves(capsys):
    import socket

    from ampflow.cli import main

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(["model-status", "--port", str(port), "--wait-s", "0.3", "--retries", "0",
                 "--timeout-s", "0.5"])  # (polls every 0.2 s: 1 s waited for nothing)
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"model 'ampflow' at 127.0.0.1:{port} was not AVAILABLE within --wait-s 0.3" in err


class _RecordingRaw(io.RawIOBase):
    """A raw stream that keeps each write, as a pipe's reader sees them."""

    def __init__(self):
        self.writes: list[bytes] = []

    def writable(self):
        return True

    def write(self, data):
        self.writes.append(bytes(data))
        return len(data)


def test_write_whole_lines_makes_each_print_one_write_even_unbuffered():
    stream = io.TextIOWrapper(_RecordingRaw(), write_through=True)  # as PYTHONUNBUFFERED=1
    print("unbuffered", file=stream, flush=True)
    assert stream.buffer.writes == [b"unbuffered", b"\n"]  # what let another writer in between
    write_whole_lines(stream)
    stream.buffer.writes.clear()
    print("  train", "done in 1.0 s", file=stream, flush=True)
    print("no flush asked", file=stream)
    assert stream.buffer.writes == [b"  train done in 1.0 s\n", b"no flush asked\n"]


def test_the_console_script_writes_whole_lines_under_pythonunbuffered():
    code = ("import sys\nfrom ampflow.cli import main\nsys.argv = ['ampflow']\nmain()\n"
            "print('state', sys.stdout.write_through, sys.stderr.write_through)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=60)
    assert done.stdout.splitlines()[-1] == "state False False", done.stderr[-2000:]


def test_the_console_script_without_a_command_prints_help_and_exits_2():
    """`ampflow` alone (a newcomer's first try) once raised ValueError in the argv scan."""
    done = subprocess.run([sys.executable, "-m", "ampflow.cli"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout.startswith("usage: ampflow") and "Traceback" not in done.stderr



def test_the_serving_commands_alone_run_without_the_dispatcher_or_the_steps():
    """`python -m ampflow.serving.cli` (a serving container) runs through ampflow.command,
    not the dispatcher that imports every step (the serving image has no steps' code)."""
    code = ("import sys\nfrom ampflow.serving.cli import main\n"
            "try:\n    code = main(['model-status', '--port', 'x'])\n"
            "except SystemExit as e:  # argparse's own usage error\n    code = e.code\n"
            "print('code', code, sorted(m for m in sys.modules if m.split('.')[:2] in ("
            "['ampflow', 'cli'], ['ampflow', 'components'], ['ampflow', 'pipeline'])))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.splitlines()[-1] == "code 2 []", done.stderr[-2000:]
    assert done.stderr.startswith("ampflow model-status: error: ")


def test_a_subset_of_commands_is_named_among_the_dispatchers_own():
    from ampflow.cli import COMMANDS, build_parser

    parser = build_parser(("ampflow.serving.cli",))
    assert parser.command_parser("serve") and not parser.command_parser("train")
    with pytest.raises(ValueError, match="ampflow.nowhere.cli is not an ampflow command"):
        build_parser(("ampflow.nowhere.cli",))
    assert [m.__name__.rsplit(".", 2)[-2] for m in COMMANDS] == [
        "prepare_data", "pretrain", "train", "evaluate_parity", "export_savedmodel",
        "convert_tflite", "serving", "deploy_serving", "pipeline"]  # `ampflow --help` order

# --- one style of help and errors in every command (issue 27 part 4) ---------------------------

def _summaries(cli) -> dict[str, str]:
    sub = next(a for a in cli["parser"]._actions if isinstance(a, argparse._SubParsersAction))
    return {choice.dest: choice.help for choice in sub._choices_actions}


def test_every_command_summary_is_a_capitalised_sentence_and_its_own_description(cli):
    summaries = _summaries(cli)
    assert set(summaries) == set(cli["commands"])
    for name, text in summaries.items():
        assert text[0].isupper() and text.endswith("."), (name, text)
        description = cli["commands"][name].description
        assert description and description[0].isupper(), name  # `ampflow X --help` says what
        assert " ".join(description.split()[:6]) in " ".join(cli["help"][name].split()), name


def test_flag_help_is_sentences_with_defaults_in_the_users_units(cli):
    for command, text in cli["help"].items():
        for block in _option_blocks(text):
            assert "(default: )" not in block and "(default: [" not in block, (command, block)
            assert "(default: True)" not in block and "(default: False)" not in block, block
            assert "{" not in block.split(" ", 1)[0], block  # choices as a|b, not {a,b}
    serve = next(b for b in _option_blocks(cli["help"]["serve"])
                 if b.startswith("--max-message-bytes"))
    assert "(default: 64 MiB)" in serve and "67108864" not in serve


@pytest.mark.parametrize("command", ["train", "run-local", "demo"])
def test_xla_is_set_one_way_everywhere(cli, command):
    (xla,) = [a for a in cli["commands"][command]._actions if "--xla" in a.option_strings]
    assert tuple(xla.choices) == ("auto", "on", "off")
    blocks = [b for b in _option_blocks(cli["help"][command]) if b.startswith("--xla")]
    assert len(blocks) == 1 and "(default: auto)" in blocks[0]
    assert "jit-compile" not in cli["help"][command]  # the old spellings work, unadvertised


@pytest.mark.parametrize("argv, dest, value, note", [
    (["train", "--xla", "on"], "jit_compile", True, None),
    (["train", "--xla", "auto"], "jit_compile", None, None),
    (["train", "--jit-compile"], "jit_compile", True, "--jit-compile is deprecated; use --xla on"),
    (["train", "--no-jit-compile"], "jit_compile", False,
     "--no-jit-compile is deprecated; use --xla off"),
    (["run-local", "--jit-compile", "false"], "xla", "off",
     "--jit-compile false is deprecated; use --xla off"),
    (["demo", "--xla", "off"], "xla", "off", None),
])
def test_old_xla_spellings_still_work_with_a_one_line_note(argv, dest, value, note, capsys):
    from ampflow.cli import build_parser

    required = {"train": ["--data-dir", "d", "--output-dir", "o"], "run-local": ["--workdir", "w"],
                "demo": []}[argv[0]]
    args = build_parser().parse_args([*argv, *required])
    assert getattr(args, dest) == value
    err = capsys.readouterr().err
    assert (note in err and len(err.splitlines()) == 1) if note else err == ""


def _usage_error(argv, capsys) -> str:
    from ampflow.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert len(err.strip().splitlines()) == 1 and "usage:" not in err, err
    return err


@pytest.mark.parametrize("argv, message", [
    (["train", "--data-dir", "d", "--output-dir", "o", "--precision", "fp16"],
     "ampflow train: error: --precision must be one of auto, float32, mixed_float16, "
     "mixed_bfloat16. Received: --precision='fp16'; did you mean mixed_float16?"),
    (["train", "--data-dir", "d", "--output-dir", "o", "--xla", "of"],
     "--xla must be one of auto, on, off. Received: --xla='of'; did you mean off?"),
    (["run-local", "--workdir", "w", "--precision", "bf16"], "did you mean mixed_bfloat16?"),
    (["compile", "--checkpoints", "workspaces"], "did you mean workspace?"),
    (["serve", "--version-policy", "lastest"], "did you mean latest?"),
    (["train", "--data-dir", "d", "--output-dir", "o", "--epochs", "many"],
     "argument --epochs: invalid int value: 'many'"),
])
def test_a_bad_flag_is_one_line_with_the_closest_choice_and_no_usage_dump(argv, message, capsys):
    err = _usage_error(argv, capsys)
    assert message in err and f"(see `ampflow {argv[0]} --help`)" in err


@pytest.mark.parametrize("argv, message", [
    (["train", "--data-dir", "{tmp}", "--output-dir", "{tmp}/m", "--epochs", "0"],
     "ampflow train: error: --epochs must be > 0. Received: --epochs=0"),
    (["train", "--data-dir", "{tmp}", "--output-dir", "{tmp}/m", "--label-smoothing", "1"],
     "--label-smoothing must be in [0, 1). Received: --label-smoothing=1.0"),
    (["train", "--data-dir", "{tmp}", "--output-dir", "{tmp}/m", "--model", "resnet"],
     "--model must be a built-in name"),
    (["compile", "--image", "r/a:1", "--gpu-toleration", "nvidia.com/gpu:NoSchedul"],
     "--gpu-toleration must be KEY[=VALUE]:EFFECT"),
    (["compile", "--image", "r/a:1", "--gpu-node-selector", "gke-accelerator"],
     "--gpu-node-selector must be KEY=VALUE"),
    (["compile", "--image", "r/a:1", "--train-memory", "lots"],
     "--train-memory must be REQUEST or REQUEST:LIMIT"),
    (["compile", "--image", "r/a:1", "--train-gpus", "0"], "--train-gpus must be >= 1"),
    (["compile", "--image", "latest"], "--image must be a pinned image reference"),
    (["compile", "--image", "r/a:1", "--allreduce-dtype", "compute"],
     "they need --train-workers > 1"),
    (["run-local", "--workdir", "{tmp}/w", "--allreduce-bytes-per-pack", "4096"],
     "they need --train-workers > 1"),
    (["run-local", "--workdir", "{tmp}/w", "--train-workers", "2", "--no-packed-allreduce",
      "--allreduce-dtype", "compute"], "they need --packed-allreduce"),
    (["submit", "--host", "localhost:8080", "--image", "r/a:1"],
     "--host must be an http(s) URL"),
])
def test_config_errors_name_the_flag_and_exit_2(argv, message, tmp_path, capsys):
    from ampflow.cli import main

    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "_" not in err.split(" error: ", 1)[1].split(" ", 1)[0], err  # a flag, not a field


def test_the_same_kind_of_error_has_the_same_exit_code_in_every_command(tmp_path, capsys):
    """2: usage or config (nothing ran); 1: the command ran and failed.

    tests/test_cli_promises.py holds the rule's table for every command.
    """
    from ampflow.cli import main

    missing = str(tmp_path / "nope")
    named_nothing = {  # a flag that names no input: configuration, exit 2 (it was 1)
        "evaluate": ["evaluate", "--model-dir", missing, "--data-dir", missing,
                     "--output-dir", str(tmp_path / "e")],
        "check-model": ["check-model", "--data-dir", missing],
    }
    for name, argv in named_nothing.items():
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and err.startswith(f"ampflow {name}: error: "), (name, err)
    code = main(["submit", "--host", "http://127.0.0.1:9", "--image", "r/a:1", "--param",
                 "epoch=3"])
    assert code == 2


def test_compile_without_an_image_says_how_to_get_one(tmp_path, capsys, monkeypatch):
    from ampflow.cli import main

    monkeypatch.delenv("AMPFLOW_IMAGE", raising=False)
    out = tmp_path / "p.yaml"
    code = main(["compile", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "--image is required" in err and "$AMPFLOW_IMAGE" in err, err
    assert not out.exists()  # the unpullable placeholder is never compiled in silently


@pytest.mark.parametrize("dataset, code, message", [
    ("mnistt", 2, "--dataset must be a TFDS catalog name"),
    ("mnist", 1, "needs a download"),
])
def test_a_failed_prepare_data_leaves_nothing_behind(dataset, code, message, tmp_path, capsys,
                                                     monkeypatch):
    import socket

    from ampflow.cli import main
    from ampflow.components.prepare_data import step

    with socket.socket() as s:  # "no network" on any machine: a closed loopback port
        s.bind(("127.0.0.1", 0))
        monkeypatch.setattr(step, "_DOWNLOAD_PROBE", ("127.0.0.1", s.getsockname()[1]))
    out = tmp_path / "out"
    assert main(["prepare-data", "--dataset", dataset, "--output-dir", str(out)]) == code
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()  # no empty <out>/tfds/


def test_the_old_xla_pipeline_parameter_still_works_with_a_note(capsys):
    from ampflow.pipeline.parameters import parse_param

    assert parse_param("jit_compile=true") == ("xla", "on")
    assert parse_param("jit_compile=false") == ("xla", "off")
    err = capsys.readouterr().err.splitlines()
    assert err == ["note: --param jit_compile=true is deprecated; use --param xla=on",
                   "note: --param jit_compile=false is deprecated; use --param xla=off"]
    assert parse_param("xla=auto") == ("xla", "auto") and capsys.readouterr().err == ""
