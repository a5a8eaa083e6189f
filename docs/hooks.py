"""mkdocs hook: pages generated at build time, so they cannot drift. The CLI reference (docs/cli.md):
each command's ``--help`` text, as click renders it from the typer app, replaces the page's
``<!-- cli-reference -->`` marker. The index of results (docs/results.md): every saved result of
``benchmarks/`` and ``experiments/``, with the script that made it, its date (the file's last
commit) and the machine it records, replaces ``<!-- results-index -->``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import typer

MARKER = "<!-- cli-reference -->"
RESULTS_MARKER = "<!-- results-index -->"
ROOT = Path(__file__).resolve().parents[1]
# result files whose name does not start with the name of the script that writes them
WRITTEN_BY = {"first_heatmap": "dashboard", "watched": "dashboard", "kernels": "kernel_methods"}


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


def _date(path: Path) -> str:
    """The day ``path`` was last committed (empty outside a git checkout or for a new file)."""
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%cs", "--", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=30
        )
    except OSError:
        return ""
    return out.stdout.strip()


def _machine(doc) -> str:
    """Where a result was measured, as its file records it (benchmarks/record.py's fields)."""
    if not isinstance(doc, dict):
        return ""
    env = doc.get("meta") if isinstance(doc.get("meta"), dict) else doc
    parts = []
    if env.get("machine"):
        names = [s.strip() for s in str(env["machine"]).split(",") if s.strip() not in ("", "?")]
        parts.append(", ".join(dict.fromkeys(names)))
    if env.get("cpus"):
        parts.append(f"{env['cpus']} CPUs")
    if env.get("torch"):
        parts.append(f"torch {env['torch']}")
    load = env.get("load_average")
    if isinstance(load, list) and load:
        parts.append(f"load {load[0]:.1f}")
    return ", ".join(parts)


def results_index() -> str:
    """A Markdown table of every result file under benchmarks/results and experiments/results."""
    rows = ["| result | made by | date | machine |", "|---|---|---|---|"]
    for folder in ("benchmarks", "experiments"):
        scripts = sorted((p.stem for p in (ROOT / folder).glob("*.py")), key=len, reverse=True)
        for path in sorted((ROOT / folder / "results").glob("*.json")):
            script = next((s for s in scripts if path.stem.startswith(s)), "")
            script = script or next((s for k, s in WRITTEN_BY.items() if path.stem.startswith(k)), "")
            try:
                doc = json.loads(path.read_text())
            except ValueError:
                doc = None
            command = f"`python {folder}/{script}.py`" if script else ""
            rel = path.relative_to(ROOT)
            rows.append(f"| `{rel}` | {command} | {_date(path)} | {_machine(doc)} |")
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    if RESULTS_MARKER in markdown:
        markdown = markdown.replace(RESULTS_MARKER, results_index())
    return markdown
