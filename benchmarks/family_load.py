"""A Qwen3-shaped model of about half a billion parameters on the CPU: what attn-lab takes to load
it and draw the first heatmap of one head, and the spectrum of every head, against what
transformers takes to load it and run one eager forward with ``output_attentions`` on the same
tokens (what a notebook with transformers does to see one pattern).

The folder is random (``transformers.Qwen3ForCausalLM`` with a fixed seed, saved in bf16 as the
models people download are), shaped like Qwen3-0.6B: 28 layers, d_model 1024, 16 query and 8
key/value heads of d_head 128, QK-norm, an MLP of 3072, 151,936 tokens with tied embeddings. Every
measurement runs in a fresh process, so its peak memory is its own; both sides hold the weights
in float32.

    python benchmarks/family_load.py               # the 0.6B shape, 3 fresh processes each
    python benchmarks/family_load.py --quick       # a tiny Qwen3, 1 process each, nothing saved

Prints the median seconds of each step and the growth of each process's peak RSS (``VmHWM``)
over what its imports took, against the float32 weights (the goal: at most 1.5 times).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import record  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "family_load.json"
FULL = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    num_hidden_layers=28,
    vocab_size=151936,
    tie_word_embeddings=True,
)
QUICK = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_hidden_layers=2,
    vocab_size=1000,
    tie_word_embeddings=True,
)
TOKENS = 128  # the input both sides see
MEMORY_GOAL = 1.5  # peak RSS growth / float32 weights

_PRELUDE = """
import json, sys, time
sys.path.insert(0, {root!r})
import torch
torch.manual_seed(0)
def hwm():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
tokens = torch.randint(0, {vocab}, (1, {T})).tolist()[0]
"""

# attn-lab: load, the first heatmap of layer 0's head 0 (its scores over the sequence, as the
# Heatmaps page draws them), then the spectrum of every head of every layer.
OURS = """
import attn_core as al
from attn_core.figures.base import Plot
base = hwm()
t0 = time.perf_counter()
m = al.load({folder!r})
t1 = time.perf_counter()
loaded_kib = hwm()
plot = al.view(m, tokens, layer=0, heads=[0]).plot(0, "scores")
assert isinstance(plot, Plot)
t2 = time.perf_counter()
heatmap_kib = hwm()
table = al.spectrum(m)
t3 = time.perf_counter()
print(json.dumps(dict(load_s=t1 - t0, first_heatmap_s=t2 - t1, spectrum_s=t3 - t2, heads=int(len(table)),
                      params=m.config.n_params(), base_kib=base, loaded_kib=loaded_kib, heatmap_kib=heatmap_kib,
                      peak_kib=hwm())))
"""

# transformers: load in float32 with the eager attention, one forward with output_attentions.
THEIRS = """
import transformers
base = hwm()
t0 = time.perf_counter()
model = transformers.AutoModelForCausalLM.from_pretrained({folder!r}, dtype=torch.float32, attn_implementation="eager")
t1 = time.perf_counter()
with torch.no_grad():
    out = model(torch.tensor([tokens]), output_attentions=True)
t2 = time.perf_counter()
assert len(out.attentions) == model.config.num_hidden_layers
print(json.dumps(dict(load_s=t1 - t0, forward_s=t2 - t1, base_kib=base, peak_kib=hwm())))
"""


def write_folder(folder: Path, shape: dict) -> int:
    """A random Qwen3 folder in bf16; its parameter count."""
    import torch
    import transformers

    cfg = transformers.Qwen3Config(max_position_embeddings=4096, **shape)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def once(body: str, folder: Path, vocab: int) -> dict:
    code = _PRELUDE.format(root=str(ROOT), vocab=vocab, T=TOKENS) + body.format(folder=str(folder))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise SystemExit(f"a measured process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per side (>= 1)")
    ap.add_argument("--quick", action="store_true", help="smoke run: a tiny Qwen3, one process per side, not saved")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    shape = QUICK if args.quick else FULL
    repeats = 1 if args.quick else args.repeats
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen3-bf16"
        params = write_folder(folder, shape)
        file_mib = sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 2**20
        ours, theirs = [], []
        for _ in range(repeats):  # alternated, so that a change of load hits both sides alike
            ours.append(once(OURS, folder, shape["vocab_size"]))
            theirs.append(once(THEIRS, folder, shape["vocab_size"]))
    weights = params * 4 / 2**20
    growth = {
        side: statistics.median((r["peak_kib"] - r["base_kib"]) / 1024 for r in runs)
        for side, runs in (("ours", ours), ("theirs", theirs))
    }
    first = median(ours, "load_s") + median(ours, "first_heatmap_s")
    baseline = median(theirs, "load_s") + median(theirs, "forward_s")
    print(
        f"Qwen3 shape: {shape['num_hidden_layers']} layers, d_model {shape['hidden_size']}, "
        f"{shape['num_attention_heads']}/{shape['num_key_value_heads']} heads of {shape['head_dim']}, "
        f"{params:,} parameters ({weights:.0f} MiB in float32, {file_mib:.0f} MiB bf16 file), {TOKENS} tokens, "
        f"medians of {repeats} fresh process(es)"
    )
    print(
        f"attn-lab: load {median(ours, 'load_s'):.2f} s + first heatmap {median(ours, 'first_heatmap_s'):.2f} s "
        f"= {first:.2f} s; spectrum of all {ours[0]['heads']} heads {median(ours, 'spectrum_s'):.2f} s"
    )
    print(
        f"transformers: load {median(theirs, 'load_s'):.2f} s + eager forward with output_attentions "
        f"{median(theirs, 'forward_s'):.2f} s = {baseline:.2f} s"
    )
    print(f"first heatmap / transformers' load and forward: {first / baseline:.2f}x")
    held = ours[0]["params"]
    print(
        f"attn-lab holds {held:,} parameters ({held * 4 / 2**20:.0f} MiB in float32; the tied unembedding is "
        f"the embedding, the {held - params:,} more are zero biases the family has no tensor for)"
    )
    steps = {}
    for key, step in (("loaded_kib", "the load"), ("heatmap_kib", "the first heatmap"), ("peak_kib", "the spectrum")):
        grown = statistics.median((r[key] - r["base_kib"]) / 1024 for r in ours)
        steps[key] = grown
        print(f"attn-lab: peak RSS growth by the end of {step} {grown:.0f} MiB = {grown / weights:.2f}x")
    for side, name in (("ours", "attn-lab"), ("theirs", "transformers")):
        ratio = growth[side] / weights
        print(
            f"{name}: peak RSS growth {growth[side]:.0f} MiB = {ratio:.2f}x the float32 weights "
            f"(goal <= {MEMORY_GOAL}x)"
        )
    if not args.quick:
        doc = dict(
            shape=shape,
            params=params,
            tokens=TOKENS,
            weights_mib=weights,
            file_mib=file_mib,
            first_heatmap_total_s=first,
            transformers_total_s=baseline,
            ratio=first / baseline,
            peak_growth_mib=growth,
            ours_step_growth_mib=steps,
            peak_ratio={"ours": growth["ours"] / weights, "theirs": growth["theirs"] / weights},
            ours=ours,
            theirs=theirs,
            **record.environment(),
        )
        record.save(doc, RESULTS)


if __name__ == "__main__":
    main()
