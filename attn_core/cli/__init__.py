"""The ``attn-lab`` command (also ``python -m attn_core``). Every command takes ``--json`` and
then prints exactly one JSON document on stdout; errors go to stderr as one line (with
``--json`` also a JSON object ``{"error": ..., "kind": ...}`` on stdout), exit code 2 for bad
input and 1 for an unexpected error, never a traceback (:func:`main`).

One module per command group, each a ``typer.Typer`` whose commands are listed here
(:data:`GROUPS`): ``models`` (zoo, eval, train, presets), ``bilinear`` (spectrum, scores, heads,
export), ``sinks``, ``rotary`` (offsets, pair), ``circuits`` (circuits, attribute), ``runs`` (retrain, runs,
runs show), ``sweep`` (sweep, sweeps, sweeps show), ``dynamics`` (metrics across checkpoints), ``grow``, ``kernels`` (kernels,
kernels-bench), ``qk`` (compare-qk), ``export`` (export-hf), ``gallery`` and ``edit`` (edit, diff); ``common`` holds what
they share. Every model NAME goes through ``attn_core.sources.resolve``; option defaults whose
setting lives in a config dataclass are read from it (``attn_core.validate.default``).

Start-up is lazy (:class:`LazyGroup`): ``attn-lab --help``, a mistyped command or option of the
root answer from the groups' source text (read, never imported), and a command imports only its
own group's module, so help never waits for torch or pandas (``benchmarks/cli_startup.py``).
Help is click's plain text, wrapped at the terminal's width by whole words."""

from __future__ import annotations

import ast
import difflib
import functools
import importlib
import importlib.util
import os
import re
import shutil
import sys
import warnings

import typer
import typer.core
import typer.main

from attn_core.cli.common import message_of, report
from attn_core.training import interrupt

# The command groups in `attn-lab --help` order: a module of attn_core/cli and its Typer apps
# ("app" holds plain commands; any other name is a sub-group registered under the name given).
GROUPS: tuple[tuple[str, dict[str, str]], ...] = (
    ("models", {"app": ""}),
    ("bilinear", {"app": ""}),
    ("sinks", {"app": ""}),
    ("rotary", {"app": ""}),
    ("circuits", {"app": ""}),
    ("runs", {"app": "", "runs_app": "runs"}),
    ("sweep", {"app": "", "sweeps_app": "sweeps"}),
    ("dynamics", {"app": ""}),
    ("grow", {"app": ""}),
    ("kernels", {"app": ""}),
    ("qk", {"app": ""}),
    ("export", {"app": ""}),
    ("gallery", {"app": ""}),
    ("edit", {"app": ""}),
)
HELP = "attn-lab: see, measure, regularize and retrain the QK bilinear form of attention."
MIN_WIDTH, MAX_WIDTH = 30, 100  # help text columns: the terminal's, within these


def help_width() -> int:
    """The column count help is wrapped at: the terminal's (``COLUMNS`` when set), at least
    :data:`MIN_WIDTH` and at most :data:`MAX_WIDTH`."""
    return max(MIN_WIDTH, min(MAX_WIDTH, shutil.get_terminal_size((80, 24)).columns - 1))


@functools.cache
def command_table() -> dict[str, tuple[str, str, str]]:
    """``{command: (module, Typer attribute, help)}`` read from the groups' source with
    :mod:`ast`: the modules are not imported (their imports reach torch)."""
    table: dict[str, tuple[str, str, str]] = {}
    for module, apps in GROUPS:
        spec = importlib.util.find_spec(f"{__name__}.{module}")
        with open(spec.origin, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        groups = {}  # sub-groups come after the module's plain commands
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                for name in _commands_of(node, apps):
                    table[name] = (module, "app", ast.get_docstring(node) or "")
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                for target in node.targets:
                    if isinstance(target, ast.Name) and apps.get(target.id):
                        kw = {k.arg: k.value for k in node.value.keywords}
                        text = kw["help"].value if isinstance(kw.get("help"), ast.Constant) else ""
                        groups[apps[target.id]] = (module, target.id, text)
        table.update(groups)
    return table


def _commands_of(fn: ast.FunctionDef, apps: dict[str, str]) -> list[str]:
    """The names under which ``@app.command("name")`` (or ``@app.command()``) registers ``fn``."""
    names = []
    for dec in fn.decorator_list:
        if (
            isinstance(dec, ast.Call)
            and isinstance(dec.func, ast.Attribute)
            and dec.func.attr == "command"
            and isinstance(dec.func.value, ast.Name)
            and dec.func.value.id == "app"
            and "app" in apps
        ):
            given = dec.args[0].value if dec.args and isinstance(dec.args[0], ast.Constant) else None
            names.append(given or fn.name.replace("_", "-"))
    return names


class _Formatter(typer.Context.formatter_class):
    """Click's help formatter whose option column narrows with the terminal (click keeps it
    30 wide and squeezes the text beside it into 10 columns); a longer option name puts its
    text on the next line."""

    def write_dl(self, rows, col_max: int = 30, col_spacing: int = 2) -> None:
        super().write_dl(rows, min(col_max, max(8, (self.width - self.current_indent) // 3)), col_spacing)


class _Context(typer.Context):
    formatter_class = _Formatter


def _plain_help(cmd):
    """Click's plain help (wrapped paragraphs, never Rich's boxes) for ``cmd`` and its
    subcommands, a group's commands listed by :func:`format_commands`."""
    cmd.rich_markup_mode = None
    cmd.context_class = _Context
    if hasattr(cmd, "commands"):
        cmd.format_commands = functools.partial(format_commands, [(n, c.help or "") for n, c in cmd.commands.items()])
        for sub in cmd.commands.values():
            _plain_help(sub)
    return cmd


def format_commands(rows: list[tuple[str, str]], ctx, formatter) -> None:
    """A group's commands, each with its docstring's first sentence wrapped by words (click
    cuts it to one line with "...")."""
    with formatter.section("Commands"):
        formatter.write_dl([(name, _first_sentence(text)) for name, text in rows], col_max=16)


@functools.cache
def _load(module: str, attr: str):
    """The click command of one Typer app of a group module (importing that module only); each
    command's callback first says that start-up is over (``interrupt.command_started``)."""
    group = importlib.import_module(f"{__name__}.{module}")
    return _started(_plain_help(typer.main.get_command(getattr(group, attr))))


def _started(cmd):
    """``cmd`` (and its subcommands) with callbacks that end the start-up phase of signals."""
    for sub in getattr(cmd, "commands", {}).values():
        _started(sub)
    callback = cmd.callback
    if callback is not None and not getattr(callback, "_starts", False):

        @functools.wraps(callback)
        def run(*args, **kwargs):
            interrupt.command_started()
            return callback(*args, **kwargs)

        run._starts = True
        cmd.callback = run
    return cmd


class LazyGroup(typer.core.TyperGroup):
    """The root command: lists commands from :func:`command_table` and imports a command's
    module only when that command runs (or shows its help)."""

    context_class = _Context

    def list_commands(self, ctx) -> list[str]:
        return list(command_table())

    def get_command(self, ctx, name: str):
        if name not in command_table():
            return None
        module, attr, _ = command_table()[name]
        cmd = _load(module, attr)
        if attr != "app":  # a sub-group (runs, sweeps): named here
            cmd.name = name
            return cmd
        return cmd.commands[name] if hasattr(cmd, "commands") else cmd

    def format_commands(self, ctx, formatter) -> None:
        format_commands([(name, text) for name, (_, _, text) in command_table().items()], ctx, formatter)

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        # A mistyped command is answered here, before typer coerces the root's parameters (which
        # imports pydantic): the one line click would print, with the nearest commands.
        if args and not args[0].startswith("-") and args[0] not in command_table():
            near = difflib.get_close_matches(args[0], list(command_table()), n=3)
            hint = f" Did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
            ctx.fail(f"No such command {args[0]!r}.{hint}")
        return super().parse_args(ctx, args)

    def make_context(self, info_name, args, parent=None, **extra):
        extra.setdefault("terminal_width", help_width())
        extra.setdefault("max_content_width", MAX_WIDTH)
        return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # before click turns it into Abort (and prints a blank line)
            raise Interrupted() from None


class Interrupted(Exception):
    """Ctrl-C that no command handled (while modules load, say): exit 130, one line."""


def _first_sentence(text: str) -> str:
    """The first sentence of a docstring's first paragraph (ends at a full stop and a capital)."""
    para = " ".join(text.split("\n\n")[0].split())
    end = re.search(r"\.\s+(?=[A-Z])", para)
    return para if end is None else para[: end.start() + 1]


app = typer.Typer(
    cls=LazyGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help=HELP,
)


@app.callback()
def _root() -> None:
    pass


def main(argv: list[str] | None = None, signals: interrupt.CliSignals | None = None) -> None:
    """Run the command line: every error, a usage error or a bug included, ends as one line
    on stderr (and with ``--json`` a JSON error object on stdout), never a traceback (set
    ATTN_LAB_DEBUG=1 to see the traceback of an unexpected error). Ctrl-C, SIGTERM or SIGHUP
    that no command handles exits 128 + the signal (130 for Ctrl-C) with the one line
    ``interrupted``, at any moment of start-up too (``training.interrupt.CliSignals``;
    ``attn_core.__main__`` installs it before this module loads). ``argv`` given (a test): the
    signal handlers are restored when it returns."""
    args = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in args
    guard = signals or interrupt.CliSignals(process=argv is None).install()
    guard.as_json = as_json
    try:
        warnings.formatwarning = _warning_line
        code = _run(args, as_json)
    except KeyboardInterrupt:  # between click's handlers: still one line
        code = _interrupted(as_json)
    if guard.signum is not None and not guard.said:  # a signal was swallowed (by a library), and the
        code = _interrupted(as_json)  # command ended otherwise: it was still interrupted
    guard.code = code if isinstance(code, int) else 0
    guard.phase = "exit"
    if not guard.process:
        guard.restore()
    sys.exit(guard.code)


def _run(args: list[str], as_json: bool):
    try:
        return app(args=args, prog_name="attn-lab", standalone_mode=False)
    except _usage_errors() as e:  # a bad option, a missing argument, a value of the wrong type
        if type(e).__name__ == "NoArgsIsHelpError":  # `attn-lab` alone: the help, as click shows it
            e.show()
            return e.exit_code
        return report(_usage_line(e), as_json, "usage", getattr(e, "exit_code", 2))
    except (Interrupted, *_aborts()):  # Ctrl-C outside a command that handles it
        return _interrupted(as_json)
    except RecursionError as e:
        return report(message_of(e), as_json, "invalid", 2)
    except MemoryError:
        return report("out of memory: the input is larger than this machine can hold", as_json, "limit", 1)
    except Exception as e:  # a bug: still one line, and the way to see more
        guard = interrupt._CLI
        if guard is not None and guard.signum is not None:  # a signal a library swallowed broke what came
            return _interrupted(as_json)  # after it (an import left half done): the command was interrupted
        if os.environ.get("ATTN_LAB_DEBUG"):
            raise
        name = type(e).__name__
        return report(f"unexpected {name}: {e} (set ATTN_LAB_DEBUG=1 for the traceback)", as_json, "internal", 1)


def _interrupted(as_json: bool) -> int:
    """The one line of a signal no command handled; its exit status (130 for Ctrl-C)."""
    guard = interrupt._CLI
    if guard is None:  # app() called without main (a test's runner)
        guard = interrupt.CliSignals(process=False)
        guard.as_json = as_json
    guard.line()
    return interrupt.exit_code(guard.signum)


# typer >= 0.20 carries its own copy of click: its exceptions and click's are caught alike
def _usage_errors() -> tuple[type, ...]:
    """typer's usage errors, and click's when some module has imported click itself (typer
    carries its own copy of click; importing click only to name its classes costs start-up)."""
    click = sys.modules.get("click")
    return (typer.TyperException, *((click.ClickException,) if click else ()))


def _aborts() -> tuple[type, ...]:
    click = sys.modules.get("click")
    return (typer.Abort, *((click.exceptions.Abort,) if click else ()))


def _warning_line(message, category, filename, lineno, line=None) -> str:
    """A warning as one line on stderr (``warning: ...``), not Python's two lines with source."""
    return f"warning: {' '.join(str(message).split())}\n"


def _usage_line(e: Exception) -> str:
    ctx = getattr(e, "ctx", None)
    hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    text = e.format_message() if hasattr(e, "format_message") else str(e)
    return text + hint


if __name__ == "__main__":
    main()
