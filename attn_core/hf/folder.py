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
FLOAT_DTYPES = ("F32", "F16", "BF16")  # as a safetensors header names them
MEMORY_SHARE = 0.7  # of the memory available now, what one model's float32 weights may take
MAX_SHARDS = 512


def hf_config(folder: Path) -> dict | None:
    """The folder's config.json when it names a ``model_type`` (a Hugging Face folder), else None.
    A config.json that is a link leading out of the folder is not read (``checkpoint.model_file``)."""
    if not folder.is_dir():
        return None
    try:
        path = model_file(folder, CONFIG)
        raw = read_json(path) if path.is_file() else None
    except CheckpointError:
        return None
    return raw if isinstance(raw, dict) and isinstance(raw.get("model_type"), str) else None


class TooLarge(CheckpointError, limits.LimitError):
    """A model whose weights do not fit in the memory available now (a limit, not a broken model)."""


def check_fits(cfg: ModelConfig, name: str) -> None:
    """Refuse a model whose float32 weights would not fit in the memory available now."""
    need = cfg.n_params() * 4
    have = limits.available_memory()
    if need > MEMORY_SHARE * have:
        raise TooLarge(
            f"{name} has {cfg.n_params():,} parameters, {need / 2**30:.1f} GiB as float32; "
            f"only {have / 2**30:.1f} GiB of memory is available (the limit is {MEMORY_SHARE:.0%} of it)"
        )


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a folder: model.safetensors, or the shards its index names (each
    found by ``checkpoint.model_file``: a link leading out of the folder is refused)."""
    single, index = model_file(folder, WEIGHTS), model_file(folder, INDEX)
    if single.is_file():
        return [single]
    if index.is_file():
        return sorted(set(shard_map(folder).values()))
    pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
    extra = (
        f" ({', '.join(sorted(pickled)[:3])} is a pickle and is never read; re-save with safe_serialization=True)"
        if pickled
        else ""
    )
    raise CheckpointError(f"{folder} has no {WEIGHTS} or {INDEX}{extra}")


def shard_map(folder: Path) -> dict[str, Path]:
    """The index's weight_map: tensor name -> the shard file that holds it (the index decides)."""
    weight_map = read_json(model_file(folder, INDEX), INDEX).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{INDEX} has no weight_map")
    names = {v for v in weight_map.values()}
    bad = sorted((repr(n) for n in names if not isinstance(n, str)), key=len)
    if bad:
        raise CheckpointError(f"{INDEX} names the shard {bad[0]}, which is not a file name")
    if len(names) > MAX_SHARDS:
        raise CheckpointError(f"{INDEX} names {len(names)} shards; the limit is {MAX_SHARDS}")
    paths = {}
    for n in sorted(names):
        if Path(n).name != n or not n.endswith(".safetensors"):
            raise CheckpointError(f"{INDEX} names {n!r}, not a .safetensors file in the folder")
        path = model_file(folder, n)  # a link leading out of the folder is refused too
        if not path.is_file():
            raise CheckpointError(f"{INDEX} names the shard {n}, which is missing")
        paths[n] = path
    return {k: paths[v] for k, v in weight_map.items()}


def check_shape(name: str, shape, want: tuple[int, ...]) -> None:
    """Refuse tensor ``name`` unless its (declared) ``shape`` is the ``want`` that config.json implies."""
    if tuple(shape) != tuple(want):
        raise CheckpointError(f"tensor {name!r} has shape {list(shape)}; config.json needs {list(want)}")


class Tensors:
    """The tensors of a folder's safetensors files, by name, read lazily (memory-mapped) and
    returned as float32. Only the headers are read when the folder is opened; a tensor's declared
    dtype and shape are checked (against what the config needs, :meth:`get`) before any of its
    data is read, so a header that lies about its sizes costs nothing. With an index, the index
    decides which shard holds a tensor, and a tensor found in two shards is refused."""

    def __init__(self, folder: Path):
        self.files = weight_files(folder)
        self._where: dict[str, Path] = {}
        self._declared: dict[str, tuple[str, tuple[int, ...]]] = {}
        for f in self.files:
            for k, declared in _header(f).items():
                if k in self._where:
                    raise CheckpointError(
                        f"tensor {k!r} is in two shards ({self._where[k].name} and {f.name}); "
                        "a tensor must be in one shard only"
                    )
                self._where[k], self._declared[k] = f, declared
        if not model_file(folder, WEIGHTS).is_file():  # sharded: the index decides
            index = shard_map(folder)
            for k, f in index.items():
                if self._where.get(k) != f:
                    where = f", but it is in {self._where[k].name}" if k in self._where else ", which lacks it"
                    raise CheckpointError(f"{INDEX} puts tensor {k!r} in {f.name}{where}")
            self._where = {k: f for k, f in self._where.items() if k in index}

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> Iterator[str]:
        return iter(self._where)

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """Tensor ``name`` as float32, once its declared dtype and ``shape`` (what the config
        needs) are checked, before its data is read (a CheckpointError naming it otherwise)."""
        if name not in self._where:
            raise CheckpointError(f"the checkpoint lacks tensor {name!r}")
        dtype, declared = self._declared[name]
        if dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"tensor {name!r} has dtype {dtype}; weights must be F32, F16 or BF16")
        check_shape(name, declared, shape)
        # The file is mapped for this tensor alone: the pages read stay in this process's resident
        # memory only while it is mapped, so a load holds one tensor's file pages at a time beside
        # the float copies, not the whole file's (benchmarks/family_load.py).
        with safe_open(str(self._where[name]), framework="pt") as handle:
            return handle.get_tensor(name).float()

    def close(self) -> None:
        """Nothing is held open between reads (kept for the loaders' ``finally``)."""


def _header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (dtype, shape)} as the safetensors file declares them (its header only)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {k: (handle.get_slice(k).get_dtype(), tuple(handle.get_slice(k).get_shape())) for k in handle.keys()}
    except Exception as e:  # the Rust reader raises several error types
        first = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise CheckpointError(f"{path.name} is not a readable safetensors file ({first})") from None
