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
from ampflow.components.train.models import model_names

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
    from ampflow.components.train.precision import HardwareInfo, choose_jit

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
    code = main(["model-status", "--port", str(port), "--wait-s", "1", "--retries", "0",
                 "--timeout-s", "0.5"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"model 'ampflow' at 127.0.0.1:{port} was not AVAILABLE within --wait-s 1" in err


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
