"""The CLI and pipeline-parameter reference pages, generated from the code.

An MkDocs hook, and the command that writes the pages into the repository.
`reference/cli.md` holds every `ampflow` command's `--help`, rendered from the argparse parsers
that `ampflow.cli.build_parser` builds; `reference/pipeline-parameters.md` holds the table in
`ampflow.pipeline.parameters`. The text sits in the committed Markdown, between
`<!-- generated:NAME -->` and `<!-- end generated:NAME -->`, so a reader of the Markdown on
GitHub or in an editor sees it too (the README invites reading the files directly). After
changing a flag or a parameter, rewrite the pages from the checkout's root:

    .venv/bin/python docs/hooks/generated_reference.py           # --check: only say if stale

`tests/test_docs_site.py` fails while a committed page differs from what the code generates.
At build time the hook fills the blocks again from the code (so `mkdocs serve` shows a flag
renamed a second ago) and drops the markers; a page that links to a command's anchor that no
longer exists fails `mkdocs build --strict`.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1]
# Each generated block: its name (in the markers), the page holding it, its generator.
BLOCKS = {
    "cli-reference": ("reference/cli.md", "cli_reference"),
    "pipeline-parameters": ("reference/pipeline-parameters.md", "parameters_reference"),
}
HELP_WIDTH = "100"  # argparse wraps to $COLUMNS: fixed, so the page does not depend on a terminal
# Read by parsers as they are built, and shown in their help (`compile --image`'s default): the
# generated text must be the same on every machine, so these are unset while it is made.
MACHINE_VARIABLES = ("AMPFLOW_IMAGE",)
REGENERATE = "python docs/hooks/generated_reference.py"


def begin_marker(name: str) -> str:
    """Where the block `name` starts in its page."""
    return f"<!-- generated:{name} -->"


def end_marker(name: str) -> str:
    """Where it ends: the text between the two is the generator's."""
    return f"<!-- end generated:{name} -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    """MkDocs hook: each generated block of a page, made again from the code, without markers."""
    from mkdocs.exceptions import PluginError

    try:
        return fill(markdown, keep_markers=False)
    except Exception as e:  # an import error must fail the build, with its reason
        raise PluginError(f"{page.file.src_uri}: generating the reference failed: {e!r}") from e


def fill(markdown: str, *, keep_markers: bool = True) -> str:
    """`markdown` with the text between each pair of markers generated anew.

    A begin marker without its end marker (a page written by hand) gets the block after it.
    """
    for name, (_page, generator) in BLOCKS.items():
        begin, end = begin_marker(name), end_marker(name)
        start = markdown.find(begin)
        if start < 0:
            continue
        stop = markdown.find(end, start)
        after = markdown[stop + len(end):] if stop >= 0 else markdown[start + len(begin):]
        text = globals()[generator]().rstrip("\n")
        block = f"{begin}\n\n{text}\n\n{end}" if keep_markers else text
        markdown = markdown[:start] + block + after
    return markdown


@contextlib.contextmanager
def _stable_environment():
    """$COLUMNS fixed and the machine's own settings unset while the text is generated."""
    saved = {name: os.environ.get(name) for name in ("COLUMNS", *MACHINE_VARIABLES)}
    os.environ["COLUMNS"] = HELP_WIDTH
    for name in MACHINE_VARIABLES:
        os.environ.pop(name, None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subparsers of `parser`, in the order they were registered."""
    for action in parser._actions:  # argparse has no public accessor for its subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand's one-line summary (its `help=`), as `ampflow --help` lists it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def cli_reference() -> str:
    """Markdown: `ampflow --help`, then one section per command with its whole `--help`."""
    with _stable_environment():
        from ampflow.cli import build_parser

        parser = build_parser()
        commands = _subcommands(parser)
        summaries = _summaries(parser)
        lines = ["| command | what it does |", "|---|---|"]
        lines += [f"| [`{name}`](#{name}) | {_cell(summaries.get(name, ''))} |"
                  for name in commands]
        lines += ["", "## ampflow", "", "```text", parser.format_help().rstrip(), "```", ""]
        for name, sub in commands.items():
            lines += [f"## {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
        return "\n".join(lines)


def parameters_reference() -> str:
    """Markdown: the pipeline's run parameters, their types, defaults and meaning."""
    from ampflow.pipeline.parameters import PIPELINE_PARAMETERS

    lines = ["| name | type | default | meaning |", "|---|---|---|---|"]
    for name, (kind, default, text) in PIPELINE_PARAMETERS.items():
        shown = f"`{default!r}`" if default != "" else '`""` (empty)'
        lines.append(f"| `{name}` | {kind.__name__} | {shown} | {_cell(text)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell (`<base>` is text, not an HTML tag)."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("\n", " ")


def stale_pages(docs: Path | None = None) -> list[str]:
    """The pages (under `docs`, default this checkout's) that differ from what the code makes.

    Compared word by word: argparse may wrap a usage line differently from one Python minor
    to the next (the project supports two), which changes no flag and no word of the page.
    """
    docs = docs or DOCS
    pages = sorted({page for page, _ in BLOCKS.values()})
    return [page for page in pages
            if _words(fill((docs / page).read_text())) != _words((docs / page).read_text())]


def _words(text: str) -> list[str]:
    return text.split()


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated pages in place (`--check`: only list the stale ones, exit 1)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true",
                        help="Write nothing; exit 1 naming each page that is not up to date.")
    args = parser.parse_args(argv)
    stale = stale_pages()
    if args.check:
        for page in stale:
            print(f"docs/{page} differs from the code: run {REGENERATE}", file=sys.stderr)
        return 1 if stale else 0
    for page in stale:
        path = DOCS / page
        path.write_text(fill(path.read_text()))
        print(f"rewrote docs/{page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
