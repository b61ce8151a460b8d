"""MkDocs hook: the CLI and pipeline-parameter reference pages, generated from the code.

`reference/cli.md` gets every `ampflow` command's `--help`, rendered from the argparse parsers
that `ampflow.cli.build_parser` builds; `reference/pipeline-parameters.md` gets the table in
`ampflow.pipeline.parameters`. The text is made at build time (never committed), so a renamed
flag or a new parameter shows in the site without anyone editing a page, and a page that links
to a command's anchor that no longer exists fails `mkdocs build --strict`.
"""

from __future__ import annotations

import argparse
import html
import os

from mkdocs.exceptions import PluginError

# A page holds one of these markers where the generated text goes.
MARKERS = {
    "<!-- generated:cli-reference -->": "cli_reference",
    "<!-- generated:pipeline-parameters -->": "parameters_reference",
}
HELP_WIDTH = "100"  # argparse wraps to $COLUMNS: fixed, so the page does not depend on a terminal


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Replace each generation marker in a page with the text generated from the code."""
    for marker, generator in MARKERS.items():
        if marker in markdown:
            try:
                markdown = markdown.replace(marker, globals()[generator]())
            except Exception as e:  # an import error must fail the build, with its reason
                raise PluginError(f"{page.file.src_uri}: generating {marker} failed: {e!r}"
                                  ) from e
    return markdown


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
    old_columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
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
    finally:
        if old_columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old_columns


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
