"""A model folder with checkpoints, and the ways one of them can be damaged (the CLI and page
tests of the Dynamics page use both): a truncated file, W_Q of swapped shape, W_K reshaped to the
same count, a NaN weight, a missing tensor, a checkpoint of another architecture, and junk in the
index's step list."""

import json
from pathlib import Path

from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from attn_core import checkpoint
from attn_core.training import checkpoints as ckpt
from tests.conftest import make_tiny_model

KINDS = ("truncated", "swapped", "reshaped", "nan", "missing", "architecture", "junk steps")
BAD_STEP = 2
STEP_OF = {kind: i + 1 for i, kind in enumerate(KINDS)}  # damage_all: each kind on its own step


def model_with_checkpoints(folder: Path, steps: int = 4) -> Path:
    """A tiny two-layer reverse model saved at ``folder`` with checkpoints at 0..``steps`` (no
    training: the weights differ by seed)."""
    folder = checkpoint.save(make_tiny_model(n_layers=2, seed=steps), folder, {"task": "reverse"})
    writer = ckpt.CheckpointWriter(ckpt.CheckpointPlan(every=1), steps)
    writer.start(folder / checkpoint.CHECKPOINTS, make_tiny_model(n_layers=2, seed=0))
    for step in range(1, steps + 1):
        writer.write(step, make_tiny_model(n_layers=2, seed=step))
    return folder


def _rewrite(path: Path, change) -> None:
    data = path.read_bytes()
    tensors, meta = st_load(data), checkpoint.metadata(data)
    path.write_bytes(st_save(change(tensors), metadata=meta))


def damage_all(folder: Path) -> dict[int, str]:
    """Every kind of damage at once, each on its own step (:data:`STEP_OF`; the model needs
    checkpoints up to len(KINDS) + 1): {step: words its reason must hold}."""
    return {STEP_OF[kind]: damage(folder, kind, STEP_OF[kind]) for kind in KINDS}


def damage(folder: Path, kind: str, step: int = BAD_STEP) -> str:
    """Damage checkpoint ``step`` of ``folder`` (or its index) in the way ``kind`` names;
    returns words the reason for skipping it must hold."""
    series = folder / checkpoint.CHECKPOINTS
    path = series / ckpt.file_name(step)
    if kind == "truncated":
        path.write_bytes(path.read_bytes()[:300])
        return "truncated"
    if kind == "swapped":
        _rewrite(path, lambda t: {**t, "blocks.0.attn.W_Q": t["blocks.0.attn.W_Q"].transpose(-1, -2).contiguous()})
        return "tensor blocks.0.attn.W_Q has shape [2, 8, 16], the config needs [2, 16, 8]"
    if kind == "reshaped":
        _rewrite(path, lambda t: {**t, "blocks.0.attn.W_K": t["blocks.0.attn.W_K"].reshape(2, 32, 4).contiguous()})
        return "tensor blocks.0.attn.W_K has shape [2, 32, 4]"
    if kind == "nan":
        _rewrite(path, lambda t: {**t, "blocks.1.attn.W_V": t["blocks.1.attn.W_V"].clone().fill_(float("nan"))})
        return "tensor blocks.1.attn.W_V contains NaN or Inf values"
    if kind == "missing":
        _rewrite(path, lambda t: {k: v for k, v in t.items() if k != "blocks.0.attn.W_K"})
        return "missing tensors for this config: blocks.0.attn.W_K"
    if kind == "architecture":
        path.write_bytes(ckpt.to_bytes(make_tiny_model(n_layers=2, n_heads=4), step, "all"))
        return "another architecture (n_heads=4; the series has n_heads=2)"
    if kind == "junk steps":
        index = json.loads((series / ckpt.INDEX).read_text())
        index["steps"][index["steps"].index(step)] = "x"
        index["steps"].append(10**30)
        index["files"].append(ckpt.file_name(step + 1))
        (series / ckpt.INDEX).write_text(json.dumps(index))
        return "not a checkpoint of its step"
    raise ValueError(kind)
