"""``scores`` on long inputs: ``--text FILE --length N`` (the first N tokens of a text by the
model's tokenizer, or N random tokens with ``--random-seed``) and ``--topk K``, the per-query top
keys, entropy and sink mass from the blocked scores (``bilinear.blocked``), never T x T.

Every option is checked before any work: --topk and --length are whole numbers, --length within
the model's context and the text, --topk within the length, the layer and head exist; a long
input (more than ``bilinear.blocked.LONG_INPUT`` tokens, the one threshold of long inputs) without --topk is
refused with a line naming it."""

from __future__ import annotations

from pathlib import Path

import typer

from attn_core.cli.common import emit, input_tokens, table

HUMAN_ROWS = 20  # without --json a long input shows its first and last this many queries

TextOpt = typer.Option(
    None,
    "--text",
    help="Score the first --length tokens of this text (.txt, .jsonl, .parquet), by the model's tokenizer.json.",
)
LengthOpt = typer.Option(
    None, "--length", help="Tokens of --text (default: the context) or of --random-seed's random tokens."
)
TopkOpt = typer.Option(
    None,
    "--topk",
    help="Per query the K top keys, entropy and sink mass from blocked scores (any length; needed past 512 tokens).",
)


def _whole(name: str, value, lo: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name} must be a whole number >= {lo}, got {value!r}")
    return value


def check_options(text: Path | None, length, topk, tokens, sample_seed, random_seed) -> None:
    """The checks that need no model."""
    _whole("--topk", topk, 1)
    _whole("--length", length, 1)
    if text is not None and any(x is not None for x in (tokens, sample_seed, random_seed)):
        raise ValueError("give --text or one of --tokens, --sample-seed and --random-seed, not both")
    if length is not None and text is None and random_seed is None:
        raise ValueError("--length needs --text FILE or --random-seed")


def long_tokens(loaded, text: Path | None, length, tokens, sample_seed, random_seed) -> list[int]:
    """The input's token ids, --length checked against the model's context first."""
    from attn_core import bilinear
    from attn_core.text.prefix import text_tokens

    n_ctx = loaded.model.cfg.n_ctx
    if length is not None and length > n_ctx:
        raise ValueError(f"--length {length} is beyond the model's context of {n_ctx} tokens")
    if text is not None:
        return text_tokens(loaded, text, length)
    if length is not None:
        return bilinear.random_tokens(loaded, random_seed, length)
    return input_tokens(loaded, tokens, sample_seed, random_seed)


def result_bytes(n: int, topk: int) -> int:
    """About what the printed result of ``n`` queries with ``topk`` keys each takes while it is
    built (Python objects, then the JSON text): 4.0 KB per query at --topk 8, measured at 32768."""
    return n * (450 * topk + 400)


def check_length(loaded, ids: list[int], topk: int | None) -> None:
    """--topk against the input's length, a long input without --topk refused, and the memory of
    the forward and the result (``blocked.forward_bytes``, :func:`result_bytes`): all before the
    forward."""
    from attn_core import limits
    from attn_core.bilinear.blocked import LONG_INPUT, TOP_K, check_input, forward_bytes

    n = len(ids)
    if topk is None and n > LONG_INPUT:
        raise ValueError(
            f"{n} tokens are a long input (more than {LONG_INPUT}): give --topk K (e.g. {TOP_K}) for the per-query "
            "top keys (blocked scores, never T x T)"
        )
    if topk is not None and topk > n:
        raise ValueError(f"--topk {topk} is past the input's {n} tokens")
    check_input(loaded.model, ids)
    if topk is not None:
        need = forward_bytes(loaded.model, n) + result_bytes(n, topk)
        limits.check_memory(f"--topk {topk} on {n} tokens (the forward and the result)", need)


def blocked_scores(loaded, ids: list[int], layer: int, head: int, topk: int, as_json: bool) -> None:
    """Print the per-query top keys (key, score, weight), entropy and sink mass of one head."""
    import math

    from attn_core import bilinear
    from attn_core.bilinear.blocked import layer_qk, row_stats

    qk = layer_qk(loaded.model, ids, layer)
    stats = row_stats(qk, head, k=topk)
    names = bilinear.token_names(loaded)
    queries = stats.queries()
    bad = next((q["query"] for q in queries if not math.isfinite(q["entropy"])), None)
    if bad is not None:
        raise ValueError(f"the scores of L{layer}H{head} are not finite at query {bad} (the weights overflow)")
    result = {
        "name": loaded.name,
        "layer": layer,
        "head": head,
        "n_tokens": len(ids),
        "topk": topk,
        "sink_key": 0,
        "window": qk.window,
        "token_ids": ids,
        "tokens": [names[t] for t in ids],
        "queries": queries,
    }

    def human(r):
        toks, queries = r["tokens"], r["queries"]
        shown = queries if len(queries) <= 2 * HUMAN_ROWS else queries[:HUMAN_ROWS] + queries[-HUMAN_ROWS:]
        rows = [
            dict(
                query=q["query"],
                token=toks[q["query"]],
                top=" ".join(f"{t['key']}:{toks[t['key']]}({t['weight']:.2f})" for t in q["top"][:3]),
                entropy=q["entropy"],
                sink=q["sink"],
                **({"learned_sink": q["learned_sink"]} if "learned_sink" in q else {}),
            )
            for q in shown
        ]
        lines = table(rows, list(rows[0])).split("\n")
        left = len(queries) - len(shown)
        if left:
            lines.insert(HUMAN_ROWS + 1, f"... {left} queries left out ...")
        mean = lambda key: sum(q[key] for q in queries) / len(queries)  # noqa: E731
        return "\n".join(lines) + (
            f"\n{r['n_tokens']} tokens, L{layer}H{head}: top {topk} keys per query (the first 3 shown; --json for "
            "all, with scores), entropy of each row (nats), sink = weight on token 0"
            + (f"; the first and last {HUMAN_ROWS} queries shown, --json has every one" if left else "")
            + f"\nmean over all {len(queries)} queries: entropy {mean('entropy'):.3g} nats, sink {mean('sink'):.3g}"
            + (
                f", learned sink {mean('learned_sink'):.3g} (the head's sink logit)"
                if "learned_sink" in queries[0]
                else ""
            )
        )

    emit(result, as_json, human)


def long_plot(loaded, figure: str, ids: list[int], layer: int, head: int, query: int | None):
    """``export --figure long-map`` (the whole input, pooled to the figure's size, the query's
    row marked) or ``long-rows`` (entropy and sink mass per query; CSV: every query's top keys)."""
    from attn_core import bilinear
    from attn_core.bilinear.blocked import check_input, layer_qk, row_stats
    from attn_core.bilinear.long_map import long_map
    from attn_core.figures import long_view

    if query is not None and not 0 <= query < len(ids):
        raise ValueError(f"--query {query} is outside 0..{len(ids) - 1}")
    check_input(loaded.model, ids)
    qk = layer_qk(loaded.model, ids, layer)
    stats = row_stats(qk, head)
    if figure == "long-map":
        return long_view.map_plot(long_map(qk, stats), len(ids) - 1 if query is None else query)
    return long_view.rows_plot(stats, layer, bilinear.position_labels(loaded, ids))
