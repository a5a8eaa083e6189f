"""Long inputs on a GPT-2-small-sized model: load, first heatmap, head change, spectrum, memory.

    python benchmarks/long_inputs.py               # GPT-2 small shape, 1024 tokens, medians of 5
    python benchmarks/long_inputs.py --json        # the result as JSON on stdout
    python benchmarks/long_inputs.py --quick       # a smoke run: a tiny GPT-2, 128 tokens, not saved
    python benchmarks/long_inputs.py --memory      # peak memory of `scores --topk` at 1k..32k tokens only

A random-initialised GPT-2 (transformers' GPT2Config(n_layer=12, n_head=12, n_embd=768): d_head
64, vocabulary 50257, context 1024, 124M parameters) is saved by transformers as a Hugging Face
folder (model.safetensors) in a temporary directory. Then, medians of --repeats:

- load: ``attn_core.sources.resolve(folder)``, read, converted and validated (a fresh load each time);
- first heatmap after load, at 1024 random tokens, for layer 0 and for the last layer: what the
  Heatmaps page does before its first chart, ``bilinear.layer_scores`` (Q and K, the forward stopped
  at that layer), ``LayerScores.view`` (the head's row normalisers by the blocked pass, then window,
  top-k, overview) and ``figures.bilinear.window_plot``
  serialised to the JSON Streamlit sends; "all figures" adds the pattern window, the top keys and
  the overview;
- head change: the same figures for another head from the cached ``LayerScores`` (no forward);
- spectrum of all 144 heads: ``bilinear.spectrum_rows(model)`` (singular values, eigenvalues of B and of
  (B + B^T)/2, norms and ranks of every head);
- peak memory: the process's peak resident set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``:
  Python, torch and the weights together), read before loading, after the first load and at the end.

Peak memory at long lengths (``--memory``; ``--quick`` runs the Mistral at 2k tokens): a grouped-query
Llama (4 query heads, 2 key heads) and a Mistral with a 64-token sliding window, both d_model 32,
2 layers, context 32768, random weights written by transformers; for each and for --lengths,
``python -m attn_core scores F --layer 1 --head 0 --random-seed 0 --length N --topk 8 --json``
in a fresh process (stdout thrown away), its peak resident set (``ru_maxrss`` of that child,
``os.wait4``) next to what the command's memory check estimates (``blocked.forward_bytes`` and
``cli.long_scores.result_bytes``: what the forward and the result add to Python and torch). Saved in
benchmarks/results/long_inputs_memory.json.

Saves benchmarks/results/long_inputs.json (not with --quick).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import plotly.io as pio  # noqa: E402
import torch  # noqa: E402

from attn_core import bilinear, sources  # noqa: E402
from attn_core.figures import bilinear as fb  # noqa: E402
from benchmarks import record  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "long_inputs.json"
MEMORY_OUT = ROOT / "benchmarks" / "results" / "long_inputs_memory.json"
LENGTHS = (1024, 8192, 16384, 32768)
QUICK_LENGTHS = (2048,)  # past LONG_INPUT, and past a window block of 512 queries
SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
    max_position_embeddings=32768,
    bos_token_id=0,
    eos_token_id=0,
)
FAMILIES = {
    "llama-gqa": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral-window64": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=64)),
}
FULL = dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257, tokens=1024)
QUICK = dict(
    n_layer=2, n_head=4, n_embd=64, n_positions=128, vocab_size=1000, bos_token_id=0, eos_token_id=0, tokens=128
)
TARGETS_S = dict(load=10.0, first_heatmap=3.0, head_change=0.5, spectrum=2.0)


WRITER = """
import json, sys, torch, transformers
shape, folder = json.loads(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
transformers.GPT2LMHeadModel(transformers.GPT2Config(**shape)).save_pretrained(folder, safe_serialization=True)
"""


SMALL_WRITER = """
import json, sys, torch, transformers
config, model, extra, folder = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
cfg = getattr(transformers, config)(**extra)
getattr(transformers, model)(cfg).save_pretrained(folder, safe_serialization=True)
"""


def write_small(folder: Path, family: str) -> None:
    """A random d_model-32, 2-layer model of ``family`` (FAMILIES) written by transformers."""
    config, model, extra = FAMILIES[family]
    args = [sys.executable, "-c", SMALL_WRITER, config, model, json.dumps({**SMALL, **extra}), str(folder)]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"writing the {family} folder with transformers failed:\n{r.stderr[-2000:]}")


def child_peak_mib(args: list[str]) -> tuple[float, int]:
    """(peak resident MiB, exit status) of one child process running ``args``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode != 0:
        print(f"  exit {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}", file=sys.stderr)
    return usage.ru_maxrss / 1024, proc.returncode


def measure_memory(lengths, families=tuple(FAMILIES)) -> dict:
    """Peak RSS of ``scores --topk 8`` per family and length (see the module doc)."""
    from attn_core.bilinear.blocked import forward_bytes
    from attn_core.cli.long_scores import result_bytes

    out = {}
    with tempfile.TemporaryDirectory(prefix="attn-lab-long-mem-") as tmp:
        for family in families:
            folder = Path(tmp) / family
            write_small(folder, family)
            model = sources.resolve(folder).model
            rows = []
            for n in lengths:
                args = [sys.executable, "-m", "attn_core", "scores", str(folder), "--layer", "1", "--head", "0"]
                args += ["--random-seed", "0", "--length", str(n), "--topk", "8", "--json"]
                start = time.perf_counter()
                peak, rc = child_peak_mib(args)
                rows.append(
                    dict(
                        tokens=n,
                        peak_rss_mib=round(peak, 1),
                        exit=rc,
                        wall_s=round(time.perf_counter() - start, 2),
                        estimate_mib=round((forward_bytes(model, n) + result_bytes(n, 8)) / 2**20, 1),
                    )
                )
                print(
                    f"{family:<18} {n:>6} tokens: peak RSS {peak:7.0f} MiB, "
                    f"estimate {rows[-1]['estimate_mib']:7.1f} MiB, exit {rc}",
                    file=sys.stderr,
                )
            out[family] = rows
    return out


def write_gpt2(folder: Path, shape: dict) -> float:
    """A random-initialised GPT-2 of ``shape`` saved by transformers, in a child process (so that
    transformers' copy of the weights never counts in this process's peak memory); returns the
    seconds it took."""
    start = time.perf_counter()
    config = {k: v for k, v in shape.items() if k != "tokens"}
    r = subprocess.run([sys.executable, "-c", WRITER, json.dumps(config), str(folder)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"writing the GPT-2 folder with transformers failed:\n{r.stderr[-2000:]}")
    return time.perf_counter() - start


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out


def figures(lv, first_only: bool) -> int:
    """Build the page's figures of a LongView and serialise them as st.plotly_chart does; returns
    the bytes of JSON sent."""
    plots = [fb.window_plot(lv, "scores")]
    if not first_only:
        plots += [fb.window_plot(lv, "pattern"), fb.top_keys_plot(lv), fb.overview_plot(lv, "pattern")]
    return sum(len(pio.to_json(p.fig, validate=False)) for p in plots)


def measure(folder: Path, n_tokens: int, repeats: int) -> dict:
    loads = []
    for _ in range(repeats):
        gc.collect()
        t, loaded = timed(sources.resolve, folder)
        loads.append(t)
        if len(loads) == 1:
            rss_after_load = peak_rss_mib()  # later loads may add garbage not yet returned to the system
        if len(loads) < repeats:
            del loaded
    cfg = loaded.config
    query = n_tokens - 1
    out = dict(load_s=loads)
    for name, layer in (("layer0", 0), ("last_layer", cfg.n_layers - 1)):
        first, full, sent = [], [], 0
        for r in range(repeats):
            tokens = bilinear.random_tokens(loaded, r, n_tokens)  # a new input: nothing cached
            t, scores = timed(bilinear.layer_scores, loaded, tokens, layer)
            t2, lv = timed(scores.view, 0, query)
            t3, sent = timed(figures, lv, first_only=True)
            t4, _ = timed(figures, lv, first_only=False)
            first.append(t + t2 + t3)
            full.append(t + t2 + t4)
        out[f"first_heatmap_{name}_s"] = first
        out[f"all_figures_{name}_s"] = full
        out["first_heatmap_json_bytes"] = sent
    heads = []
    for r in range(repeats):
        head = 1 + r % (cfg.n_heads - 1)
        t, lv = timed(scores.view, head, query)
        t2, _ = timed(figures, lv, first_only=False)
        heads.append(t + t2)
    out["head_change_s"] = heads
    spectra = []
    for _ in range(repeats):
        t, rows = timed(bilinear.spectrum_rows, loaded.model)
        spectra.append(t)
    out["spectrum_s"] = spectra
    out["spectrum_heads"] = len(rows)
    out["peak_rss_after_load_mib"] = rss_after_load
    out["peak_rss_mib"] = peak_rss_mib()
    out["layer_scores_mib"] = (scores.qk.q.numel() + scores.qk.k.numel()) * 4 / 2**20  # Q and K, never S
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="samples per figure (>= 5)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to save the JSON ('-' to not save)")
    parser.add_argument("--quick", action="store_true", help="smoke run: a tiny GPT-2, 2 repeats, not saved")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    parser.add_argument(
        "--memory", action="store_true", help="only the peak memory of `scores --topk` at --lengths (two small models)"
    )
    parser.add_argument(
        "--lengths", default=",".join(map(str, LENGTHS)), help="token counts of --memory, comma-separated"
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    shape = FULL
    if args.quick:
        shape, args.repeats, args.out = QUICK, 2, Path("-")
    elif args.repeats < 5:
        parser.error("--repeats must be at least 5 (medians of >= 5)")
    try:
        import transformers  # noqa: F401
    except ImportError:
        sys.exit("this benchmark writes its GPT-2 folder with transformers: pip install -r requirements-dev.txt")
    if args.memory or args.quick:
        try:
            lengths = QUICK_LENGTHS if args.quick else tuple(int(n) for n in args.lengths.split(","))
        except ValueError:
            parser.error(f"--lengths must be whole numbers separated by commas, got {args.lengths!r}")
        families = ("mistral-window64",) if args.quick else tuple(FAMILIES)
        memory = dict(families=measure_memory(lengths, families), shape=SMALL, **record.environment())
        if args.memory:
            if args.out != Path("-"):
                record.save(memory, MEMORY_OUT if args.out == DEFAULT_OUT else args.out)
            print(json.dumps(memory, indent=2) if args.json else "peak memory saved", file=sys.stdout)
            return 0

    with tempfile.TemporaryDirectory(prefix="attn-lab-long-") as tmp:
        folder = Path(tmp) / "gpt2-random"
        write_s = write_gpt2(folder, shape)
        rss_start = peak_rss_mib()
        samples = measure(folder, shape["tokens"], args.repeats)
        weights_mib = (folder / "model.safetensors").stat().st_size / 2**20
    medians = {k[:-2]: statistics.median(v) for k, v in samples.items() if k.endswith("_s")}
    result = dict(
        shape=shape,
        medians_s=medians,
        samples_s={k[:-2]: v for k, v in samples.items() if k.endswith("_s")},
        targets_s=TARGETS_S,
        peak_rss_mib=samples["peak_rss_mib"],
        peak_rss_after_load_mib=samples["peak_rss_after_load_mib"],
        peak_rss_before_load_mib=rss_start,
        weights_mib=weights_mib,
        layer_scores_mib=samples["layer_scores_mib"],
        first_heatmap_json_bytes=samples["first_heatmap_json_bytes"],
        spectrum_heads=samples["spectrum_heads"],
        write_folder_s=write_s,
        repeats=args.repeats,
        **record.environment(),
    )
    if args.out != Path("-"):
        record.save(result, args.out)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    s = shape
    print(
        f"GPT-2 shape: {s['n_layer']} layers x {s['n_head']} heads, d_model {s['n_embd']}, vocabulary "
        f"{s['vocab_size']}, {s['tokens']} tokens; medians of {args.repeats}, torch {torch.__version__} with "
        f"{result['threads']} threads, load average {result['load_average'][0]:.1f} on {os.cpu_count()} CPUs"
    )
    rows = [
        ("load (sources.resolve)", "load", TARGETS_S["load"]),
        ("first heatmap after load, layer 0", "first_heatmap_layer0", TARGETS_S["first_heatmap"]),
        (f"first heatmap after load, layer {s['n_layer'] - 1}", "first_heatmap_last_layer", TARGETS_S["first_heatmap"]),
        ("  all four figures, layer 0", "all_figures_layer0", None),
        (f"  all four figures, layer {s['n_layer'] - 1}", "all_figures_last_layer", None),
        ("head change (cached scores, four figures)", "head_change", TARGETS_S["head_change"]),
        (f"spectrum of all {result['spectrum_heads']} heads", "spectrum", TARGETS_S["spectrum"]),
    ]
    print(f"{'measure':<44} {'median':>9} {'range':>17} {'target':>9}")
    for label, key, target in rows:
        v, lo, hi = medians[key], min(result["samples_s"][key]), max(result["samples_s"][key])
        verdict = "" if target is None else f"<= {target:g} s {'met' if v <= target else 'MISSED'}"
        print(f"{label:<44} {v:>8.3f}s {lo:>7.3f}-{hi:<7.3f}s  {verdict}")
    print(
        f"peak memory (ru_maxrss, the whole process): {result['peak_rss_mib']:.0f} MiB "
        f"(before loading {rss_start:.0f} MiB, after the first load {result['peak_rss_after_load_mib']:.0f} MiB; "
        f"weights file {weights_mib:.0f} MiB, one layer's Q and K {result['layer_scores_mib']:.0f} MiB); "
        f"first heatmap sends {result['first_heatmap_json_bytes'] / 1024:.0f} KiB of JSON"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
