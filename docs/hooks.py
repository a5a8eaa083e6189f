"""mkdocs hook: the CLI reference (docs/cli.md) is generated from the typer app at build time, so it
cannot drift from the commands: each command's ``--help`` text, as click renders it, replaces the
page's ``<!-- cli-reference -->`` marker."""

from __future__ import annotations

import typer

MARKER = "<!-- cli-reference -->"


def _walk(command, path: list[str], parent, out: list[str]) -> None:
    """Append the help of ``command`` (a click command of the typer app) and of its subcommands."""
    ctx = command.context_class(command, info_name=path[-1], parent=parent, terminal_width=100, max_content_width=100)
    text = command.get_help(ctx)
    level = "#" * min(len(path) + 1, 4)
    out.append(f"{level} `{' '.join(path)}`\n\n```text\n{text}\n```\n")
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                _walk(sub, [*path, name], ctx, out)


def cli_reference() -> str:
    """Markdown for every command of ``attn-lab``: its ``--help`` under a heading of its own."""
    from attn_core.cli import app

    out: list[str] = []
    _walk(typer.main.get_command(app), ["attn-lab"], None, out)
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown
