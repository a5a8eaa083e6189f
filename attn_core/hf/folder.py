"""Reading a local Hugging Face model folder: its config.json, its weights (``model.safetensors``
or a sharded checkpoint with ``model.safetensors.index.json``), in fp32, fp16 or bf16, memory-
mapped by safetensors and converted to float32 one tensor at a time, and a memory estimate
made before anything is built. Only JSON and safetensors are read; a pickled
``pytorch_model.bin`` is never opened.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from attn_core import limits
from attn_core.checkpoint import CONFIG, WEIGHTS, CheckpointError, model_file, read_json
from attn_core.model import ModelConfig

INDEX = "model.safetensors.index.json"
FLOAT_DTYPES = {torch.float32, torch.float16, torch.bfloat16}
MEMORY_SHARE = 0.7  # of the memory available now, what one model's float32 weights may take
MAX_SHARDS = 512


def hf_config(folder: Path) -> dict | None:
    """The folder's config.json when it names a ``model_type`` (a Hugging Face folder), else None."""
    if not (folder.is_dir() and (folder / CONFIG).is_file()):
        return None
    try:
        raw = read_json(folder / CONFIG)
    except CheckpointError:
        return None
    return raw if isinstance(raw.get("model_type"), str) else None


def check_fits(cfg: ModelConfig, name: str) -> None:
    """Refuse a model whose float32 weights would not fit in the memory available now."""
    need = cfg.n_params() * 4
    have = limits.available_memory()
    if need > MEMORY_SHARE * have:
        raise CheckpointError(
            f"{name} has {cfg.n_params():,} parameters, {need / 2**30:.1f} GiB as float32; "
            f"only {have / 2**30:.1f} GiB of memory is available (the limit is {MEMORY_SHARE:.0%} of it)"
        )


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a folder: model.safetensors, or the shards its index names."""
    if (folder / WEIGHTS).is_file():
        return [folder / WEIGHTS]
    if (folder / INDEX).is_file():
        weight_map = read_json(folder / INDEX).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{INDEX} has no weight_map")
        names = sorted({str(v) for v in weight_map.values()})
        if len(names) > MAX_SHARDS:
            raise CheckpointError(f"{INDEX} names {len(names)} shards; the limit is {MAX_SHARDS}")
        files = []
        for n in names:
            if Path(n).name != n or not n.endswith(".safetensors"):
                raise CheckpointError(f"{INDEX} names {n!r}, not a .safetensors file in the folder")
            path = model_file(folder, n)  # a link leading out of the folder is refused too
            if not path.is_file():
                raise CheckpointError(f"{INDEX} names the shard {n}, which is missing")
            files.append(path)
        return files
    pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
    extra = (
        f" ({', '.join(sorted(pickled)[:3])} is a pickle and is never read; re-save with safe_serialization=True)"
        if pickled
        else ""
    )
    raise CheckpointError(f"{folder} has no {WEIGHTS} or {INDEX}{extra}")


class Tensors:
    """The tensors of a folder's safetensors files, by name, read lazily (memory-mapped) and
    returned as float32. Names may be looked up with or without a family's prefix."""

    def __init__(self, folder: Path):
        self.files = weight_files(folder)
        self._where: dict[str, Path] = {}
        for f in self.files:
            try:
                with safe_open(str(f), framework="pt") as handle:
                    for k in handle.keys():
                        self._where[k] = f
            except Exception as e:  # the Rust reader raises several error types
                first = (str(e).splitlines() or [type(e).__name__])[0][:200]
                raise CheckpointError(f"{f.name} is not a readable safetensors file ({first})") from None
        self._handles: dict[Path, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> Iterator[str]:
        return iter(self._where)

    def get(self, name: str) -> torch.Tensor:
        """Tensor ``name`` as float32 (a CheckpointError naming it when absent or not a float)."""
        if name not in self._where:
            raise CheckpointError(f"the checkpoint lacks tensor {name!r}")
        f = self._where[name]
        if f not in self._handles:
            self._handles[f] = safe_open(str(f), framework="pt")
        t = self._handles[f].get_tensor(name)
        if t.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"tensor {name!r} has dtype {t.dtype}; weights must be fp32, fp16 or bf16")
        return t.float()

    def close(self) -> None:
        self._handles.clear()
