"""Where a spectrum is solved (issue 34's GPU check): the singular values of head-sized cores,
decomposed on their own device by ``torch.linalg`` against ``attn_core.linalg``, which solves
them on the host when they live on CUDA (``attn_core.device.decomposition_device``), and what that
makes of a live job's periodic measurements on a model of the GPU check's shape (the 88M Llama:
12 layers, 12 query heads on 4 key/value heads, d_model 768, rotary).

Cases (each the median of --repeats after one warm-up, in ms):

- ``spectrum cores``: the 144 cores [12, 12, 64, 64] of ``R.head_spectra`` (every head's B);
- ``offset cores``: the 9,360 cores [144, 65, 64, 64] of sigma_1(B(delta)) over a rotary run's
  65 offsets, what a run's before and after measurements solve;
- ``spectra refresh``: the live job's refresh of a live job (``R.head_spectra`` and the 32 watched
  heads' offset summaries);
- ``sigma1 summaries``: the offsets summary of every head, as a run's measurement makes it.

On the CPU the two paths are one (the host is where the matrices are); the figures that matter
come from ``--device cuda``.

    python benchmarks/decompositions.py                 # the CPU
    python benchmarks/decompositions.py --device cuda   # a GPU: saves benchmarks/results/decompositions_cuda.json
    python benchmarks/decompositions.py --quick         # small shapes, 1 repeat, nothing saved
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from attn_core import linalg  # noqa: E402
from benchmarks import record  # noqa: E402

FULL = dict(layers=12, heads=12, kv=4, d_model=768, d_head=64, offsets=65, vocab=8192)
QUICK = dict(layers=2, heads=4, kv=2, d_model=64, d_head=16, offsets=9, vocab=64)


def median_ms(fn, device: torch.device, repeats: int) -> float:
    def timed() -> float:
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) * 1e3

    timed()  # warm-up (cuSOLVER's and LAPACK's first call load their libraries)
    return statistics.median(timed() for _ in range(repeats))


def model_of(shape: dict, device: torch.device):
    from attn_core.model import Transformer
    from attn_core.model.config import ModelConfig

    cfg = ModelConfig(n_layers=shape["layers"], n_heads=shape["heads"], n_kv_heads=shape["kv"],
                      d_model=shape["d_model"], d_head=shape["d_head"], d_mlp=2 * shape["d_model"], n_ctx=1024,
                      d_vocab=shape["vocab"], normalization="rmsnorm", positional="rotary", gated_mlp=True,
                      mlp_act="silu")  # fmt: skip
    torch.manual_seed(0)
    return Transformer(cfg).to(device).eval()


def run(shape: dict, device: torch.device, repeats: int) -> list[dict]:
    from attn_core.bilinear.offsets import sigma1_summaries
    from attn_core.retraining.job import spectra_values
    from attn_core.training import telemetry

    g = torch.Generator().manual_seed(0)
    n, r = shape["layers"] * shape["heads"], shape["d_head"]
    spectrum_cores = torch.randn(shape["layers"], shape["heads"], r, r, generator=g).to(device)
    offset_cores = torch.randn(n, shape["offsets"], r, r, generator=g).to(device)
    rows = []
    for name, A in (("spectrum cores", spectrum_cores), ("offset cores", offset_cores)):
        here = median_ms(lambda A=A: torch.linalg.svdvals(A), device, repeats)
        ours = median_ms(lambda A=A: linalg.svdvals(A), device, repeats)
        err = (torch.linalg.svdvals(A).cpu() - linalg.svdvals(A).cpu()).abs().max().item()
        rows.append(dict(case=name, shape=list(A.shape), on_device_ms=here, attn_core_ms=ours, max_abs_diff=err))
    model = model_of(shape, device)
    heads = [(l, h) for l in range(shape["layers"]) for h in range(shape["heads"])]
    live = heads[: telemetry.LIVE_OFFSET_HEADS]

    rows.append(dict(case="spectra refresh", attn_core_ms=median_ms(lambda: spectra_values(model, live), device,
                                                                     repeats)))  # fmt: skip
    rows.append(dict(case="sigma1 summaries", attn_core_ms=median_ms(lambda: sigma1_summaries(model, heads), device,
                                                                      repeats)))  # fmt: skip
    return rows


def show(rows: list[dict], device: torch.device) -> None:
    print(f"decompositions on {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}):")
    for row in rows:
        if "on_device_ms" in row:
            print(f"  {row['case']} {row['shape']}: torch.linalg on the device {row['on_device_ms']:.1f} ms, "
                  f"attn_core.linalg {row['attn_core_ms']:.1f} ms ({row['on_device_ms'] / row['attn_core_ms']:.1f}x; "
                  f"max |diff| {row['max_abs_diff']:.1e})")  # fmt: skip
        else:
            print(f"  {row['case']}: {row['attn_core_ms']:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="small shapes, 1 repeat, nothing saved")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: nothing measured")
        return
    device = torch.device(args.device)
    shape = QUICK if args.quick else FULL
    with torch.no_grad():
        rows = run(shape, device, 1 if args.quick else args.repeats)
    show(rows, device)
    if args.quick:
        print("quick run: nothing saved")
        return
    out = args.out or ROOT / "benchmarks" / "results" / f"decompositions_{args.device}.json"
    result = dict(benchmark="decompositions", device=str(device), shape=shape, repeats=args.repeats, rows=rows,
                  created=time.strftime("%Y-%m-%d %H:%M:%S"), **record.environment())  # fmt: skip
    print(f"saved {record.save(result, out)}")


if __name__ == "__main__":
    main()
