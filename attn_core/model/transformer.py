"""The transformer: decoder-only, pre-norm, in the spirit of nanoGPT's model.py; the toys we
train and the Hugging Face families we import (``attn_core/hf/``) are all this one module.

Conventions (docs/maths.md): row vectors; for layer l the attention input is
``X = ln1(residual)`` (or the residual itself when ``normalization == "none"``); attention is
the MLP is :class:`~attn_core.model.layers.MLP` or, with ``n_experts``, a routed mixture of
experts (:mod:`attn_core.model.moe`). With ``parallel_attn`` (GPT-NeoX) the MLP reads
``ln2(residual)`` of the same residual and both outputs are added at once.

Every activation passes through a named hook point (:mod:`attn_core.hooks`, TransformerLens
names): ``run_with_cache`` records them, ``run_with_hooks`` may replace them. A plain
``model(tokens)`` carries no hook state and does no work at the hook points.

Parameter names follow TransformerLens' state dict, so ``state_dict()`` is the checkpoint
(docs/checkpoints.md); hook points hold no parameters or buffers.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from attn_core.hooks import Hook, HookRun, NamesFilter, block_names, check_names, name_filter
from attn_core.model.attention import Attention, Visibility
from attn_core.model.config import ModelConfig
from attn_core.model.layers import MLP, norm
from attn_core.model.mla import MLAttention
from attn_core.model.moe import MoE
from attn_core.validate import shown


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.names = block_names(layer, cfg.d_mlp > 0, cfg.parallel_attn)
        self.parallel = cfg.parallel_attn
        self.style, self.scale = cfg.block_norms, cfg.residual_scale
        if self.style != "post":
            self.ln1 = norm(cfg)
        self.attn = MLAttention(cfg, layer) if cfg.mla else Attention(cfg, layer)
        if self.style != "pre":  # a norm on the attention's (and the MLP's) output
            self.ln1_post = norm(cfg)
        if cfg.d_mlp > 0:
            if self.style != "post":
                self.ln2 = norm(cfg)
            if cfg.n_experts and cfg.dense_layer(layer):  # DeepSeek's first dense layers
                self.mlp = MLP(cfg, cfg.d_dense)
            else:
                self.mlp = MoE(cfg) if cfg.n_experts else MLP(cfg)
            if self.style != "pre":
                self.ln2_post = norm(cfg)

    def _in(self, which: str, x: torch.Tensor) -> torch.Tensor:
        """The input norm ``which`` (ln1, ln2) of x; x itself with post norms only."""
        return x if self.style == "post" else getattr(self, which)(x)

    def _out(self, which: str, y: torch.Tensor) -> torch.Tensor:
        """An output as added to the residual: its post norm ``which`` (sandwich, post), the residual scale."""
        if self.style != "pre":
            y = getattr(self, which)(y)
        return y * self.scale if self.scale != 1.0 else y

    def forward(self, resid: torch.Tensor, mask: torch.Tensor | Visibility, hk: HookRun | None = None) -> torch.Tensor:
        if hk is None:  # the plain path: no hook state, nothing extra to do
            if self.parallel:
                return resid + self.attn(self.ln1(resid), mask) + self.mlp(self.ln2(resid))
            resid = resid + self._out("ln1_post", self.attn(self._in("ln1", resid), mask))
            if hasattr(self, "mlp"):
                resid = resid + self._out("ln2_post", self.mlp(self._in("ln2", resid)))
            return resid
        n = self.names
        resid = hk(n["resid_pre"], resid)
        x = hk(n["attn_in"], self._in("ln1", resid))
        attn_out = hk(n["attn_out"], self._out("ln1_post", self.attn(x, mask, hk)))
        if self.parallel:  # the MLP reads the block's input, not resid + attn_out
            return hk(n["resid_post"], resid + attn_out + hk(n["mlp_out"], self.mlp(self.ln2(resid))))
        resid = resid + attn_out
        if hasattr(self, "mlp"):
            resid = hk(n["resid_mid"], resid)
            resid = resid + hk(n["mlp_out"], self._out("ln2_post", self.mlp(self._in("ln2", resid))))
        return hk(n["resid_post"], resid)


class Unembed(nn.Module):
    """The unembedding: ``W_U`` [d_model, d_vocab] and ``b_U``. With ``cfg.tied_embed``, ``W_U`` is
    the embedding's transpose, read from it on every use, as transformers ties ``lm_head`` to
    ``embed_tokens``: no parameter and no memory of its own, and training moves the one tensor
    through both of its uses."""

    def __init__(self, cfg: ModelConfig, embed: nn.Module):
        super().__init__()
        if cfg.tied_embed:
            self.__dict__["_tied"] = embed  # not a submodule: W_E stays the embedding's parameter alone
        else:
            self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab))

    def __getattr__(self, name: str):
        if name == "W_U" and "_tied" in self.__dict__:
            return self.__dict__["_tied"].W_E.T
        return super().__getattr__(name)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Module()
        self.embed.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        if cfg.positional == "learned":
            self.pos_embed = nn.Module()
            self.pos_embed.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg, l) for l in range(cfg.n_layers))
        self.ln_final = norm(cfg)
        self.unembed = Unembed(cfg, self.embed)
        self.reset_parameters()

    @classmethod
    def from_tensors(cls, cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> Transformer:
        """A model of ``cfg`` holding exactly ``tensors`` (our names, all of them), built without a
        second copy of the weights: the modules are made on the meta device and take the given
        tensors (as float32) as their parameters. Check names and shapes first
        (``checkpoint.build_checked``)."""
        with torch.device("meta"):
            model = cls(cfg)
        model.load_state_dict({k: v.float() for k, v in tensors.items()}, assign=True)
        for block in model.blocks:
            block.attn.reset_buffers()
        return model

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 style init: N(0, 0.02), output projections scaled by 1/sqrt(2 n_layers). Nothing to
        draw on the meta device (shapes only: checks, ``from_tensors``), where ``normal_`` would also
        import torch._dynamo, seconds of every first model load."""
        if self.embed.W_E.is_meta:
            return
        out_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf.startswith("b_") or leaf == "b":
                p.zero_()
            elif leaf == "w":
                p.fill_(1.0)
            elif leaf in ("W_O", "W_out"):
                p.normal_(0.0, out_std, generator=generator)
            else:
                p.normal_(0.0, 0.02, generator=generator)
        if self.cfg.d_qk is not None:
            self.zero_qk_padding()

    @torch.no_grad()
    def zero_qk_padding(self) -> None:
        """Zero the stored-but-unused W_Q/W_K columns of narrower heads."""
        for l, block in enumerate(self.blocks):
            for h in range(self.cfg.n_heads):
                w = self.cfg.head_d_qk(l, h)
                for name in ("W_Q", "W_K"):
                    getattr(block.attn, name)[h, :, w:] = 0
                if self.cfg.attn_bias:
                    block.attn.b_Q[h, w:] = 0
                    block.attn.b_K[h, w:] = 0

    def mask(self, T: int, window: int = 0) -> torch.Tensor:
        """[T, T], True where key j is visible from query i: j <= i, and i - j < ``window``
        for a sliding window (0: no window; ``cfg.window(layer)`` is a layer's)."""
        return Visibility(T, window, self.embed.W_E.device).dense()

    def residual_input(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embedding plus positions, [batch, pos, d_model]."""
        T = tokens.shape[-1]
        if T > self.cfg.n_ctx:
            raise ValueError(f"sequence of {T} tokens exceeds n_ctx={self.cfg.n_ctx}")
        x = self.embed.W_E[tokens]
        if self.cfg.embed_scale != 1.0:  # as a tensor of the embedding's dtype, as Gemma multiplies it
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype, device=x.device)
        if self.cfg.positional == "learned":
            x = x + self.pos_embed.W_pos[:T]
        return x

    def forward(self, tokens: torch.Tensor, cache: dict | None = None, hk: HookRun | None = None) -> torch.Tensor:
        """Logits [batch, pos, d_vocab] of tokens [batch, pos] (or [pos]). Pass a dict as ``cache``
        to record every activation under its name (``model(tokens, cache=cache)`` is
        ``run_with_cache`` writing into your dict; gradients flow through the cached tensors; a
        ``hooks.Cache`` records only its names)."""
        if tokens.dim() == 1:
            tokens = tokens[None]
        if cache is not None and hk is None:  # a hooks.Cache keeps only its names
            hk = HookRun(cache=cache, keep=getattr(cache, "keep", None))
        T = tokens.shape[-1]
        resid = self.residual_input(tokens)
        device = self.embed.W_E.device
        masks = {w: Visibility(T, w, device) for w in {self.cfg.window(l) for l in range(self.cfg.n_layers)}}
        for l, block in enumerate(self.blocks):
            resid = block(resid, masks[self.cfg.window(l)], hk)
        return self.logits(self.ln_final(resid))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of the final norm's output: x W_U + b_U, divided by ``logits_scaling``, capped
        (c tanh(l / c)) with ``final_softcap``."""
        out = x @ self.unembed.W_U + self.unembed.b_U
        if self.cfg.logits_scaling != 1.0:
            out = out / self.cfg.logits_scaling
        cap = self.cfg.final_softcap
        return out if cap is None else torch.tanh(out / cap) * cap

    def hook_names(self) -> list[str]:
        """Every hook point's name, in the order the forward reaches them."""
        return [name for block in self.blocks for name in block.names.values()]

    def check_token_ids(self, tokens: object) -> None:
        """Refuse, in one sentence, what the hook doors (:meth:`run_with_cache`,
        :meth:`run_with_hooks`) cannot run: no integer tensor, or an id outside the vocabulary (a
        negative one would index the embedding from its end, in silence)."""
        dtype = getattr(tokens, "dtype", None)
        if not isinstance(tokens, torch.Tensor) or dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise TypeError(f"tokens must be a tensor of token ids (integers), got {shown(tokens)}")
        V = self.cfg.d_vocab
        if tokens.numel() and tokens.device.type != "meta" and not (0 <= int(tokens.min()) and int(tokens.max()) < V):
            bad = int(tokens.min()) if int(tokens.min()) < 0 else int(tokens.max())
            raise ValueError(f"token id {bad} is outside 0..{V - 1} (the vocabulary has {V} tokens)")

    def run_with_cache(self, tokens: torch.Tensor, names_filter: NamesFilter = None) -> tuple[torch.Tensor, dict]:
        """(logits, cache): ``cache[name]`` is the activation the forward used at each hook point
        kept by ``names_filter`` (None: all; a name, a list of names, or a predicate on names).
        Not detached: call under ``torch.no_grad()`` when no gradient is needed."""
        self.check_token_ids(tokens)
        cache: dict = {}
        logits = self(tokens, hk=HookRun(cache=cache, keep=name_filter(names_filter, self.hook_names())))
        return logits, cache

    def run_with_hooks(
        self, tokens: torch.Tensor, fwd_hooks: list[tuple[str, Hook]] = (), cache: dict | None = None
    ) -> torch.Tensor:
        """Logits with ``fn(tensor, name)`` run at each named hook point of ``fwd_hooks``, in order;
        a returned tensor (same shape) replaces the activation for the rest of the forward, None
        keeps it. With ``cache`` (a dict), every activation is recorded after its hooks ran."""
        self.check_token_ids(tokens)
        hooks: dict[str, list[Hook]] = {}
        for pair in fwd_hooks:
            if not (
                isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], str) and callable(pair[1])
            ):
                raise TypeError(f"fwd_hooks must hold (name, fn) pairs, fn(tensor, name) a function, got {shown(pair)}")
            hooks.setdefault(pair[0], []).append(pair[1])
        check_names(hooks, self.hook_names())
        return self(tokens, hk=HookRun(hooks=hooks, cache=cache))

    def n_params(self) -> int:
        """The number of parameters, :meth:`ModelConfig.n_params`."""
        return self.cfg.n_params()
