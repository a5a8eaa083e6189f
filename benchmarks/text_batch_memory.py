"""What one block of text adds to a training step's memory, measured against the estimate that sets
a text run's default batch size (``attn_core.text.task.step_bytes_per_block``, ``default_batch``).

For each model shape (made by transformers with random weights and a word-level tokenizer; no
download) and with and without the KL term, a retrain on generated text (``entropy=0.1`` on every
head) is built in a fresh process at two batch sizes b and 2b and takes one training step (which
makes the optimizer's state); the peak RSS is then reset (``/proc/self/clear_refs``) and two more
steps taken: their growth over the RSS before them is what a step adds. glibc is told to map every
allocation of 64 KiB or more on its own (``MALLOC_MMAP_THRESHOLD_``), so that freed tensors leave
the RSS and the next step's are counted again. The measured cost of a block is the difference of
the two growths over b; the ratio estimate / measured says how much the estimate errs high (> 1)
or low (< 1).

    python benchmarks/text_batch_memory.py            # three shapes x (no KL, KL), results saved
    python benchmarks/text_batch_memory.py --quick    # one tiny shape, no KL, nothing saved

Also printed: the default batch size the estimate gives some published model shapes at block 256
(computed from their configs' sizes, nothing downloaded).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import record  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "text_batch_memory.json"
SHAPES = {  # name: (family, d_model, layers, heads, kv heads, d_mlp, vocabulary, block, b)
    "vocab-16k": ("llama", 128, 2, 4, 2, 512, 16_000, 128, 4),
    "deep-8-layers": ("llama", 256, 8, 8, 4, 1024, 1_000, 256, 4),
    "gpt2-vocab": ("gpt2", 256, 4, 4, 4, 1024, 50_257, 128, 2),
}
QUICK = {"tiny": ("llama", 32, 2, 4, 2, 64, 500, 16, 2)}
PUBLISHED = {  # d_model, layers, heads, d_mlp, vocabulary (their config.json sizes)
    "GPT-2 small": (768, 12, 12, 3072, 50_257),
    "Pythia-70m": (512, 6, 8, 2048, 50_304),
    "SmolLM-135M": (576, 30, 9, 1536, 49_152),
    "Qwen2-0.5B": (896, 24, 14, 4864, 151_936),
    "Llama-3.2-1B": (2048, 16, 32, 8192, 128_256),
}

CHILD = """
import json, sys
sys.path.insert(0, {root!r})
import torch
torch.set_num_threads(1)
from benchmarks.record import peak_rss_kib
from attn_core.training.config import JobConfig
from attn_core.retraining.job import TrainingJob
cfg = JobConfig(source={folder!r}, text={text!r}, batch_size={batch}, block={block}, kl={kl}, steps=10,
                regularizers=["entropy=0.1"], probe_samples=1)
trainer = TrainingJob.open(cfg, store=False).trainer
trainer.step()  # the optimizer's state is made by the first step
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak RSS starts again from the RSS now
base = peak_rss_kib()
for _ in range(2):
    trainer.step()
print(json.dumps(dict(growth_kib=peak_rss_kib() - base)))
"""


def make_folder(folder: Path, shape: tuple) -> None:
    import torch
    import transformers

    from tests.text_corpus import write_word_tokenizer

    family, d, layers, heads, kv, mlp, vocab, block, _ = shape
    if family == "gpt2":
        cfg = transformers.GPT2Config(n_layer=layers, n_embd=d, n_head=heads, n_inner=mlp, vocab_size=vocab,
                                      n_positions=block)  # fmt: skip
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                                       num_key_value_heads=kv, intermediate_size=mlp, vocab_size=vocab,
                                       max_position_embeddings=block)  # fmt: skip
        model = transformers.LlamaForCausalLM(cfg)
    torch.manual_seed(0)
    model.save_pretrained(folder, safe_serialization=True)
    write_word_tokenizer(folder, vocab)


def growth_mib(folder: Path, text: Path, batch: int, block: int, kl: float, env: dict) -> float:
    code = CHILD.format(root=str(ROOT), folder=str(folder), text=str(text), batch=batch, block=block, kl=kl)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["growth_kib"] / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one tiny shape without the KL term; nothing saved")
    args = ap.parse_args()
    from attn_core.model import ModelConfig
    from attn_core.text.task import default_batch, step_bytes_per_block
    from tests.text_corpus import make_text

    shapes, kls = (QUICK, (0.0,)) if args.quick else (SHAPES, (0.0, 0.5))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {
            **os.environ,
            "ATTN_LAB_RUNS": str(tmp / "runs"),
            "OMP_NUM_THREADS": "1",
            "MALLOC_MMAP_THRESHOLD_": "65536",
        }
        text = tmp / "text.txt"
        text.write_text(make_text(0, lines=3000))
        for name, shape in shapes.items():
            folder = tmp / name
            make_folder(folder, shape)
            _, d, layers, heads, kv, mlp, vocab, block, b = shape
            cfg = ModelConfig(d_model=d, n_layers=layers, n_heads=heads, d_head=d // heads, d_mlp=mlp, d_vocab=vocab,
                              n_ctx=block)  # fmt: skip
            for kl in kls:
                small, large = (growth_mib(folder, text, n, block, kl, env) for n in (b, 2 * b))
                measured = (large - small) / b
                estimate = step_bytes_per_block(cfg, block, kl) / 2**20
                rows.append(dict(shape=name, kl=kl, block=block, batches=[b, 2 * b], growth_mib=[round(small, 1),
                                 round(large, 1)], measured_mib_per_block=round(measured, 1),
                                 estimate_mib_per_block=round(estimate, 1),
                                 estimate_over_measured=round(estimate / measured, 2) if measured > 0 else None))  # fmt: skip
                print(json.dumps(rows[-1]))
    published = {}
    for name, (d, layers, heads, mlp, vocab) in PUBLISHED.items():
        cfg = ModelConfig(d_model=d, n_layers=layers, n_heads=heads, d_head=d // heads, d_mlp=mlp, d_vocab=vocab,
                          n_ctx=256)  # fmt: skip
        published[name] = {f"kl={kl:g}": default_batch(cfg, 256, kl) for kl in (0.0, 0.5)}
        print(json.dumps({"model": name, "default_batch_at_block_256": published[name]}))
    if not args.quick:
        record.save(dict(rows=rows, default_batch_at_block_256=published, **record.environment()), RESULTS)


if __name__ == "__main__":
    main()
