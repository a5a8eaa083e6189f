"""The shape of the library, checked from its source (docs/architecture.md):

- the import graph of ``attn_core`` has no cycle (imports inside functions count too: a lazy
  import that closes a cycle is still a cycle);
- the library never imports Streamlit;
- modules are cut by concept, not by length: a library module holds one concept and stays
  under a bound far above what any concept needs (:data:`MAX_LINES`; a module listed in
  :data:`CONCEPT_MODULES` with its reason may go further), and no function runs past
  :data:`FUNCTION_MAX_LINES` (a long function is split into named steps, never a module into
  halves of one concept);
- one place per concept: activation names are spelled only by ``attn_core.hooks``, metric names
  only by ``attn_core.training.telemetry``, the run statuses only in ``attn_core.runs``;
- one public name, one meaning: a public function or class is defined in one library module
  (less a short list of deliberate repeats and the ``al.*`` door);
- one order of bounds: a function taking both ends of a range takes the low end first.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "attn_core"
MAX_LINES = 640  # a module a reader holds whole; a concept that needs more is named below
# Modules that hold one concept whole and may run longer rather than be split mid-concept (at most
# CONCEPT_MAX_LINES), each with its reason: the reason is the concept, never the line count.
CONCEPT_MAX_LINES = 960
CONCEPT_MODULES: dict[str, str] = {
    "attn_core/retraining/job.py": "the live job: the handle's control and the loop's side publish one state under one lock",
}
FUNCTION_MAX_LINES = 150  # a function (or method) read in one screenful or two
PAGE_MAX_LINES = 400  # a page reads top to bottom: widgets, one call into attn_core, figures
PRODUCT = [LIB, ROOT / "app_pages", ROOT / "app.py", ROOT / "ui", ROOT / "navigation.py"]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(LIB.rglob("*.py"))}


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The attn_core module that ``name`` (a dotted import target) lives in, if any."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """module -> the attn_core modules it imports (anywhere in its source)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import sub` imports the submodule when one exists, else a name of pkg
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for name in names:
                target = _target(name, modules)
                if target and target != mod and target != "attn_core":
                    graph[mod].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_sees_lazy_imports(tmp_path):
    graph = import_graph()
    assert graph, "no attn_core modules found"
    # the CLI imports the library lazily inside its commands: those edges must be seen
    cli = [m for m in graph if m.startswith("attn_core.cli")]
    assert any(graph[m] for m in cli)


def test_no_import_cycle_in_attn_core():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# One public name, one meaning: a public function or class is defined in one module of the library.
# The deliberate exceptions, each a name -> (where it may repeat, why).
SHARED_NAMES: dict[str, tuple[str, str]] = {
    "main": (
        "attn_core/",
        "a program's entry point: python -m attn_core, the CLI, the worker and text child processes",
    ),
    "config": ("attn_core/hf/families/", "a family file's hook: its config.json read into a ModelConfig"),
    "slots": ("attn_core/hf/families/", "a family file's hook: its tensor table"),
    "router_fields": ("attn_core/hf/families/", "a family file's hook: its router's config fields"),
    "curves_plot": ("attn_core/figures/", "a figure module's plot of its own curves, called as fd.curves_plot"),
    "spectrum_plot": ("attn_core/figures/", "a figure module's plot of its own spectra"),
    "ranks_plot": ("attn_core/figures/", "a figure module's plot of its own ranks"),
}
# The notebook door (al.*) names each analysis as a user asks for it, over the library's own.
NAME_DOORS = ("attn_core/api.py", "attn_core/api_surgery.py")


def public_definitions(paths: list[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """name -> the modules (paths from ``root``) whose top level defines a public function or class
    of that name."""
    found: dict[str, list[str]] = {}
    for path in paths:
        rel = path.relative_to(root).as_posix()
        for node in ast.parse(path.read_text(), rel).body:
            defines = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if defines and not node.name.startswith("_"):
                found.setdefault(node.name, []).append(rel)
    return found


def names_defined_twice(found: dict[str, list[str]]) -> dict[str, list[str]]:
    """The names of ``found`` defined in more than one module, less the deliberate ones."""
    twice = {}
    for name, modules in found.items():
        where = SHARED_NAMES.get(name, (None,))[0]
        if len(modules) > 1 and not (where and all(m.startswith(where) for m in modules)):
            twice[name] = modules
    return twice


def test_the_name_finder_finds_a_name_defined_twice(tmp_path):
    (tmp_path / "a.py").write_text("def measure():\n    pass\n\n\ndef _own():\n    pass\n")
    (tmp_path / "b.py").write_text("class measure:\n    pass\n\n\ndef own():\n    pass\n")
    found = public_definitions(sorted(tmp_path.glob("*.py")), tmp_path)
    assert found == {"measure": ["a.py", "b.py"], "own": ["b.py"]}
    assert names_defined_twice(found) == {"measure": ["a.py", "b.py"]}
    # a deliberate name repeats only where its entry says
    assert names_defined_twice({"config": ["attn_core/hf/families/a.py", "attn_core/hf/families/b.py"]}) == {}
    assert names_defined_twice({"config": ["attn_core/hf/families/a.py", "attn_core/x.py"]}) != {}


def test_every_public_name_has_one_meaning():
    paths = []
    for path in sorted(LIB.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in NAME_DOORS:
            paths.append(path)
    twice = names_defined_twice(public_definitions(paths))
    assert not twice, "one public name, one meaning: name each after what it gives\n" + "\n".join(
        f"{name}: {', '.join(modules)}" for name, modules in sorted(twice.items())
    )


# One order of bounds: a function that takes both ends of a range takes the low one first, whether
# positional or named (lo, hi; min_n, max_n; q0, q1), so no caller has to remember which comes first.
BOUND_WORDS = (("lo", "hi"), ("low", "high"), ("lower", "upper"), ("min", "max"), ("start", "stop"), ("first", "last"))
BOUNDED = [LIB, ROOT / "app_pages", ROOT / "ui", ROOT / "benchmarks", ROOT / "experiments"]


def bound_end(name: str) -> tuple[tuple[str, str], int] | None:
    """(which range, 0 for its low end or 1 for its high end) that the parameter ``name`` names:
    ``lo``/``hi``, ``min_n``/``max_n``, ``n_lo``/``n_hi``, ``q0``/``q1``...; None for any other name."""
    for low, high in BOUND_WORDS:
        for end, word in enumerate((low, high)):
            if name == word:
                return (low, ""), end
            if name.startswith(word + "_"):
                return (low, "_" + name[len(word) + 1 :]), end
            if name.endswith("_" + word):
                return (low, name[: -len(word) - 1] + "_"), end
    found = re.fullmatch(r"([a-z]\w*?)([01])", name)
    return ((found[1], "01"), int(found[2])) if found else None


def bounds_high_first(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``path:line name`` of every function of ``paths`` that takes a range's high end before its low end."""
    found = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = node.args
            ends: dict[tuple[str, str], list[int]] = {}
            for arg in args.posonlyargs + args.args + args.kwonlyargs:
                end = bound_end(arg.arg)
                if end is not None:
                    ends.setdefault(end[0], []).append(end[1])
            if any(set(e) == {0, 1} and e[0] == 1 for e in ends.values()):
                found.append(f"{rel}:{node.lineno} {node.name}")
    return found


def test_the_bound_finder_finds_a_high_end_first(tmp_path):
    (tmp_path / "a.py").write_text(
        "def f(hi, lo):\n    pass\n\n\ndef g(lo, hi):\n    pass\n\n\ndef h(max_n, *, min_n=1):\n    pass\n\n\n"
        "def k(q1, q0, k0, k1):\n    pass\n\n\ndef one(hi, max_n, stop):\n    pass\n\n\ndef m(n_hi, n_lo):\n    pass\n"
    )
    assert bounds_high_first([tmp_path / "a.py"], tmp_path) == ["a.py:1 f", "a.py:9 h", "a.py:13 k", "a.py:21 m"]


def test_every_range_takes_its_low_end_first():
    paths = [p for place in BOUNDED for p in sorted(place.rglob("*.py"))]
    found = bounds_high_first(paths)
    assert not found, "one order of bounds: take the low end first\n" + "\n".join(found)


# The training loop imports nothing that stands above it: what a run starts from (presets, text,
# imported models), the live job and the Ray workers are handed in from above (attn_core.retraining);
# the ground floor's device decisions (attn_core.device) import no training.
ABOVE_TRAINING = ("text", "presets", "distributed", "retraining", "finetune", "sweep", "grow", "qk", "dynamics")
ABOVE_TRAINING += ("surgery", "documents", "figures", "gallery", "api", "api_checks", "api_surgery", "cli")
GROUND = ("attn_core.device", "attn_core.linalg", "attn_core.tasks")


def _within(name: str, place: str) -> bool:
    return name == place or name.startswith(place + ".")


def _imports_into(graph: dict[str, set[str]], low: str, above: tuple[str, ...]) -> dict[str, list[str]]:
    """The imports of the modules within ``low`` into the packages or modules ``above``."""
    places = [f"attn_core.{a}" for a in above]
    found = {
        m: sorted(t for t in ts if any(_within(t, p) for p in places)) for m, ts in graph.items() if _within(m, low)
    }
    return {m: ts for m, ts in found.items() if ts}


def test_training_imports_nothing_above_it():
    graph = import_graph()
    assert _imports_into(graph, "attn_core.training", ABOVE_TRAINING) == {}, "training/ imports what stands above it"
    for ground in GROUND:
        assert not any(t.startswith("attn_core.training") for t in graph[ground]), f"{ground} imports training/"


BELOW_TRAINING = ("attn_core.regularizers", "attn_core.model", "attn_core.bilinear", "attn_core.declarations")


def test_what_training_builds_on_imports_no_training():
    """The penalties, the model, its bilinear views and the declarations of settings stand below
    the training loop: none imports training/ (a regularizer declares its k with
    attn_core.declarations)."""
    graph = import_graph()
    for low in BELOW_TRAINING:
        assert _imports_into(graph, low, ("training",)) == {}, f"{low} imports training/"


def test_the_model_imports_nothing_of_bilinear():
    """A head's QK form is the model's concept (attn_core.model.qk_form): bilinear/ reads the model
    and builds its views on it, so the model never imports bilinear/, not even inside a function."""
    assert _imports_into(import_graph(), "attn_core.model", ("bilinear",)) == {}, "model/ imports bilinear/"


def test_library_never_imports_streamlit():
    for path in LIB.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            mods = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(m.split(".")[0] == "streamlit" for m in mods), f"{path} imports streamlit"


@pytest.mark.parametrize("path", sorted(LIB.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_library_modules_stay_readable(path):
    n, name = len(path.read_text().splitlines()), path.relative_to(ROOT).as_posix()
    bound = CONCEPT_MAX_LINES if name in CONCEPT_MODULES else MAX_LINES
    assert n <= bound, f"{name} has {n} lines; split it by concern (at most {bound})"


def test_every_concept_module_exists():
    assert all((ROOT / name).is_file() for name in CONCEPT_MODULES)


@pytest.mark.parametrize("path", sorted(LIB.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_library_functions_stay_readable(path):
    name = path.relative_to(ROOT).as_posix()
    for node in ast.walk(ast.parse(path.read_text(), name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            assert n <= FUNCTION_MAX_LINES, (
                f"{name}:{node.lineno} {node.name} has {n} lines; split it into named steps (at most {FUNCTION_MAX_LINES})"
            )


@pytest.mark.parametrize("path", sorted((ROOT / "app_pages").glob("*.py")), ids=lambda p: p.name)
def test_pages_stay_short(path):
    n = len(path.read_text().splitlines())
    assert n <= PAGE_MAX_LINES, (
        f"app_pages/{path.name} has {n} lines; move its parts (a section, live charts) into a module of ui/ "
        f"(at most {PAGE_MAX_LINES})"
    )


@pytest.mark.parametrize("path", sorted((ROOT / "ui").glob("*.py")), ids=lambda p: p.name)
def test_dashboard_modules_stay_small(path):
    n = len(path.read_text().splitlines())
    assert n <= PAGE_MAX_LINES, f"ui/{path.name} has {n} lines; split it by concern (at most {PAGE_MAX_LINES})"


def _product_files() -> list[Path]:
    out: list[Path] = []
    for p in PRODUCT:
        out += sorted(p.rglob("*.py")) if p.is_dir() else ([p] if p.exists() else [])
    return out


def _hits(pattern: str, allowed: set[str]) -> list[str]:
    rx = re.compile(pattern)
    found = []
    for path in _product_files():
        rel = str(path.relative_to(ROOT))
        if rel in allowed:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if rx.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    return found


def test_activation_names_are_spelled_in_one_place():
    # parameter names (blocks.0.attn.W_Q) are the checkpoint's; activation names carry "hook_"
    assert (
        _hits(
            r"""["']blocks\.[^"']*hook_|["']hook_(q|k|v|z|pattern|attn_scores|attn_in|attn_out|mlp_out|resid_\w+)["']""",
            {"attn_core/hooks.py"},
        )
        == []
    )


def test_metric_names_are_built_and_parsed_in_one_place():
    assert (
        _hits(
            r"""f["'](sigma|stable_rank|entropy_data|entropy_vocab|top1_data):\{""", {"attn_core/training/telemetry.py"}
        )
        == []
    )
    assert (
        _hits(r"L\\d\+H\\d\+|L\(\\d\+\)H", {"attn_core/training/telemetry.py", "attn_core/regularizers/heads.py"}) == []
    )


def test_run_statuses_are_listed_in_one_place():
    assert _hits(r"""\(["']running["'],\s*["']completed["']""", {"attn_core/runs/names.py"}) == []


PLACEMENT = "attn_core.device"  # issue 34: where tensors live is decided there only


def _device_like(node: ast.expr) -> bool:
    """``x.device``, ``torch.device(...)`` or a name that holds a device (``device``, ``*_device``)."""
    if isinstance(node, ast.Attribute) and node.attr == "device":
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "device":
        return True
    return isinstance(node, ast.Name) and (node.id in ("device", "dev") or node.id.endswith("_device"))


def device_comparisons(source: str) -> list[int]:
    """Lines of ``source`` that compare devices with == or != (a comparison with a string literal,
    ``cfg.device == "auto"``, is a setting's text, not a device)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            sides = [node.left, *node.comparators]
            if any(_device_like(s) for s in sides) and not any(isinstance(s, ast.Constant) for s in sides):
                lines.append(node.lineno)
    return lines


def test_the_device_comparison_finder_finds_one():
    assert device_comparisons("if batch.tokens.device != self.device:\n    pass") == [1]
    assert device_comparisons("ok = torch.device('cuda') == other") == [1]
    assert device_comparisons("ok = cfg.device == 'auto' or x.device.type == 'cuda'") == []


def test_only_the_placement_module_compares_devices():
    """``torch.device('cuda:0') != torch.device('cuda')``: comparing devices directly crashed every
    retrain on a GPU (issue 34); ``attn_core.device.same_device`` knows what the current CUDA device is."""
    found = {
        name: lines
        for name, path in _modules().items()
        if name != PLACEMENT and (lines := device_comparisons(path.read_text()))
    }
    assert not found, f"compare devices with attn_core.device.same_device: {found}"


def test_matrix_decompositions_run_through_one_module():
    """A batch of head-sized cores on a GPU is decomposed on the host (11 s on an H200 for the
    9,360 cores of a run's rotary offsets, cuSOLVER solving them one after another):
    ``attn_core.linalg`` applies ``attn_core.device.decomposition_device``; nothing else calls
    ``torch.linalg``'s decompositions."""
    assert _hits(r"torch\.linalg\.(qr|svd|svdvals|eigh|eigvalsh)\(", {"attn_core/linalg.py"}) == []


# The attention module owns a head's QK form (docs/architecture.md, "The form"): the query/key
# weights, their biases, the QK-norm modules and the per-head scale are read and written by name
# only in attn_core/model/ (Attention.form / set_form) and attn_core/hf/ (a family's tensors).
QK_ATTRIBUTES = {"W_Q", "W_K", "W_QK", "b_Q", "b_K", "q_norm", "k_norm", "qk_scale"}
FORM_OWNERS = ("attn_core/model/", "attn_core/hf/")
# module -> why it may still touch these by attribute (none today; a new entry needs its reason)
FORM_EXCEPTIONS: dict[str, str] = {}


def qk_reads(source: str) -> list[tuple[int, str]]:
    """(line, name) of every read or write of a query/key attribute: ``x.W_Q``, ``getattr(x, "W_Q")``,
    ``x.per_head("W_K")`` (docstrings, comments and other strings do not count)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in QK_ATTRIBUTES:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call) and node.args:
            f, first = node.func, node.args[1] if len(node.args) > 1 else node.args[0]
            by_name = (
                isinstance(f, ast.Name) and f.id in ("getattr", "setattr", "hasattr") and len(node.args) > 1
            ) or (isinstance(f, ast.Attribute) and f.attr == "per_head")
            if by_name and isinstance(first, ast.Constant) and first.value in QK_ATTRIBUTES:
                found.append((node.lineno, first.value))
    return sorted(found)


def test_the_qk_reader_finder_finds_reads_and_not_docstrings():
    source = '"""W_Q and attn.W_K in a docstring."""\n# attn.W_QK\nB = attn.W_Q @ getattr(attn, "b_K")\nattn.per_head("W_K")\nx = "W_Q"\n'
    assert qk_reads(source) == [(3, "W_Q"), (3, "b_K"), (4, "W_K")]


def test_only_the_model_and_hf_read_the_query_and_key_weights():
    bad = []
    for path in sorted(LIB.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(FORM_OWNERS) or rel in FORM_EXCEPTIONS:
            continue
        bad += [f"{rel}:{line} reads {name}" for line, name in qk_reads(path.read_text())]
    assert not bad, "go through Attention.form(head) / set_form (attn_core/model/form.py):\n" + "\n".join(bad)


def _defined_at_top(name: str) -> set[str]:
    """The files of attn_core/ and ui/ that define a public function or class ``name``."""
    out = set()
    for path in [*LIB.rglob("*.py"), *(ROOT / "ui").rglob("*.py")]:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                out.add(path.relative_to(ROOT).as_posix())
    return out


def test_a_setting_and_a_runs_measurement_have_one_name_each():
    """``setting`` declares a setting (attn_core.declarations) and means nothing else (the page's
    input of one is ``setting_input``); a run's before/after measurement is ``measure_run``, and
    neither the training loop nor the dashboard defines another ``measure``."""
    assert _defined_at_top("setting") == {"attn_core/declarations.py"}
    assert _defined_at_top("setting_input") == {"ui/widgets.py"}
    assert not {f for f in _defined_at_top("measure") if f.startswith(("attn_core/training/", "ui/"))}
