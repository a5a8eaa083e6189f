"""How fast an edit answers (a slider move on the Edit and compare page) and how fast ``diff`` is.

    python benchmarks/edit_speed.py [--repeats 7] [--json] [--out benchmarks/results/edit_speed.json]
    python benchmarks/edit_speed.py --quick     # a smoke run: smaller models, 2 samples, nothing saved

A slider move is ``surgery.edit_preview``: the edit on a copy of the model, one forward on the probes
(loss and perplexity) and the head's attention on the first probe, exactly what the page calls.
Cases and targets (CPU, torch's threads as set by OMP_NUM_THREADS):

- induction-2l (zoo), the page's 16 task samples of 24 tokens, rank 1 of L1H0: <= 0.5 s;
- a random 4-layer Llama of d_model 128 (4 query heads sharing 2 key/value heads, d_head 32),
  imported from its Hugging Face folder, 256 probe tokens, rank 4 of L3H1: <= 2 s;
- ``surgery.diff`` of two random attention-only models of GPT-2 small's attention shape (12
  layers, 12 heads, d_model 768, d_head 64; the MLPs and embeddings play no part in it): <= 10 s.

The median of ``--repeats`` runs after one warm-up is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import record  # noqa: E402

TARGETS = {
    "slider, induction-2l": 0.5,
    "slider, Llama 4 x d_model 128, 256 tokens": 2.0,
    "diff, GPT-2 small shape": 10.0,
}


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per case")
    parser.add_argument("--quick", action="store_true", help="smoke run: smaller models, 2 runs, nothing saved")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--out", type=Path, help="also save the result as JSON here")
    args = parser.parse_args()

    from attn_core import surgery
    from attn_core.dynamics.metrics import Inputs
    from attn_core.gallery.models import tiny_llama
    from attn_core.model import ModelConfig, Transformer
    from attn_core.sources import LoadedModel, resolve

    repeats = 2 if args.quick else args.repeats
    cases = {}
    zoo = resolve("induction-2l")
    inputs = surgery.edit_inputs(zoo, samples=16)
    edit = [surgery.HeadEdit(1, 0, rank=1)]
    cases["slider, induction-2l"] = median_time(lambda: surgery.edit_preview(zoo, edit, inputs, 1, 0), repeats)

    layers, tokens = (2, 64) if args.quick else (4, 256)
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_llama(
            Path(tmp) / "llama", num_hidden_layers=layers, hidden_size=128, num_attention_heads=4, num_key_value_heads=2
        )
        llama = resolve(str(folder))
    ids = torch.randint(0, llama.config.d_vocab, (1, tokens + 1), generator=torch.Generator().manual_seed(0))
    probe = Inputs(ids[:, :-1], ids[:, 1:], torch.ones(1, tokens, dtype=torch.bool), (1, 2), (tokens - 2, tokens), "")
    edit = [surgery.HeadEdit(layers - 1, 1, rank=4)]
    name = "slider, Llama 4 x d_model 128, 256 tokens"
    cases[name] = median_time(lambda: surgery.edit_preview(llama, edit, probe, layers - 1, 1), repeats)

    n_layers = 2 if args.quick else 12
    cfg = ModelConfig(n_layers=n_layers, n_heads=12, d_model=768, d_head=64, d_vocab=16, n_ctx=16)
    pair = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        m = Transformer(cfg)
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0, 0.02)
        pair.append(LoadedModel(name=f"gpt2-shape-{seed}", model=m, config=cfg))
    cases["diff, GPT-2 small shape"] = median_time(lambda: surgery.diff(*pair), max(1, repeats // 2))

    result = dict(
        quick=args.quick,
        seconds={k: round(v, 4) for k, v in cases.items()},
        targets_s=TARGETS,
        within_target={k: v <= TARGETS[k] for k, v in cases.items()},
        settings=dict(llama_layers=layers, llama_tokens=tokens, diff_layers=n_layers, repeats=repeats),
        **record.environment(),
    )
    if args.out is not None and not args.quick:
        record.save(result, args.out)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return
    for k, v in cases.items():
        print(f"{k:45s} {v:7.3f} s  (target <= {TARGETS[k]:g} s){'' if v <= TARGETS[k] else '  OVER'}")
    print(
        f"{'(quick: smaller models) ' if args.quick else ''}torch threads {result['threads']}, load {result['load_average']}"
    )


if __name__ == "__main__":
    main()
