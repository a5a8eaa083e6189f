"""Circuit commands on one model: ``circuits`` (per-head OV spectra, copying scores, QK
positivity and the composition scores with their random-matrix baseline) and ``attribute`` (one
query's scores split into the rank-1 terms of B). The documents are
``attn_core.circuits.circuits_report`` and ``attribute_report``."""

from __future__ import annotations

import math

import typer

from attn_core import limits
from attn_core.circuits.settings import KINDS, N_SAMPLES
from attn_core.cli import common
from attn_core.cli.common import JsonOpt, NameArg, check_head, emit, guarded, input_tokens, table
from attn_core.validate import check_seed

app = typer.Typer()

N_SIGMA = 3  # singular values of W_OV in the human table
N_EDGES = 8  # composition edges in the human summary
N_TERMS = 3  # rank-1 terms per key in the human table
MAX_BASELINE_SAMPLES = 10_000  # random matrix pairs per shape of the composition baseline


def strongest_edges(doc: dict, top: int = N_EDGES) -> list[dict]:
    """The ``top`` writer -> reader pairs of a circuits report with the largest score minus
    baseline, over the three kinds: kind, source, target, score, baseline, corrected."""
    order = doc["order"]
    edges = []
    for k in KINDS:
        for i, row in enumerate(doc["composition"][k]):
            for j, v in enumerate(row):
                b = doc["composition_baseline"][k][i][j]
                if v is not None and b is not None:
                    edges.append(
                        dict(kind=k.upper(), source=order[i], target=order[j], score=v, baseline=b, corrected=v - b)
                    )
    return sorted(edges, key=lambda e: e["corrected"], reverse=True)[:top]


def _circuits_text(doc: dict) -> str:
    heads = [
        dict(
            head=f"L{h['layer']}H{h['head']}",
            copying_score=h["copying_score"],
            qk_positivity=h["qk_positivity"],
            ov_sigma=", ".join(f"{s:.3g}" for s in h["ov_singular_values"][:N_SIGMA]),
        )
        for h in doc["heads"]
    ]
    lines = [
        "Per head: OV copying score and QK positivity (sum of eigenvalues / sum of their moduli, -1..1) "
        f"and the top {N_SIGMA} singular values of W_OV = W_V W_O",
        table(heads, ["head", "copying_score", "qk_positivity", "ov_sigma"]),
    ]
    edges = strongest_edges(doc)
    if edges:
        lines += [
            "",
            "Strongest composition edges (writer -> reader; score ||W_A W_B||_F / (||W_A||_F ||W_B||_F), "
            "baseline: its mean over random matrices of the same shapes)",
            table(edges, ["kind", "source", "target", "score", "baseline", "corrected"]),
        ]
    else:
        lines += ["", "One layer: no composition between heads."]
    return "\n".join(lines)


@app.command("circuits")
@guarded
def circuits_cmd(
    name: str = NameArg,
    samples: int = typer.Option(N_SAMPLES, help="Random matrix pairs per shape for the composition baseline."),
    seed: int = typer.Option(0, help="Seed of the random matrices of the baseline."),
    as_json: bool = JsonOpt,
):
    """OV spectra, copying scores and QK positivity of every head, and Q-, K-, V-composition
    scores from every earlier head into every later one, with their random-matrix baseline."""
    from attn_core.circuits import circuits_report
    from attn_core.sources import resolve

    limits.check_count("--samples", samples, hi=MAX_BASELINE_SAMPLES)
    check_seed("--seed", seed)
    emit(circuits_report(resolve(name).model, n_samples=samples, seed=seed), as_json, _circuits_text)


def _attribute_text(doc: dict) -> str:
    rows = []
    for rank, k in enumerate(doc["keys"], start=1):
        terms = sorted(k["terms"], key=lambda t: abs(t["contribution"]), reverse=True)[:N_TERMS]
        rows.append(
            dict(
                rank=rank,
                key=k["key"],
                token=k["token"],
                score=k["score"],
                **({"capped": k["capped_score"]} if "capped_score" in k else {}),
                bias=k["bias"],
                top_terms="  ".join(f"{t['term']}:{t['contribution']:+.3g}" for t in terms),
            )
        )
    what = {
        "rotation planes": "sum over rotation planes c of (Q~_c . K~_c) / sqrt(d)",
        "singular modes of the absorbed B, rotary term": "sum over i of g_q g_kv σ_i (x·u_i)(y·v_i) + the rotary term",
    }.get(doc.get("split"), "sum over i of σ_i (x·u_i)(y·v_i) + bias")
    head = f"Query {doc['query']}: f_x(y) of each key it sees = {what} (largest {N_TERMS} terms by |contribution|)"
    columns = ["rank", "key", "token", "score", "bias", "top_terms"]
    if "softcap" in doc:
        c = doc["softcap"]
        head += (
            f"\nscore is S before the head's soft cap; capped = {c:g} tanh(S / {c:g}), the model's score (same order)"
        )
        columns.insert(4, "capped")
    out = [head, table(rows, columns)]
    if len(doc["keys"]) >= 2:
        w, r = doc["keys"][0], doc["keys"][1]
        diff = sorted(
            ((t1["term"], t1["contribution"] - t2["contribution"]) for t1, t2 in zip(w["terms"], r["terms"])),
            key=lambda x: -abs(x[1]),
        )[:N_TERMS]
        margin = w["score"] - r["score"]
        out.append(
            f"key {w['key']} beats key {r['key']} by {margin:.4g}; largest differences: "
            + ", ".join(f"{d} {v:+.3g}" for d, v in diff)
            + (f", bias {w['bias'] - r['bias']:+.3g}" if not math.isclose(w["bias"], r["bias"]) else "")
        )
    return "\n".join(out)


@app.command("attribute")
@guarded
def attribute_cmd(
    name: str = NameArg,
    layer: int = typer.Option(0, help="Layer index."),
    head: int = typer.Option(0, help="Head index."),
    query: int | None = typer.Option(None, help="Query position (default: the last token)."),
    tokens: str | None = common.TokensOpt,
    sample_seed: int | None = common.SampleSeedOpt,
    random_seed: int | None = common.RandomSeedOpt,
    top: int | None = typer.Option(None, help="Only the K best keys (default: every key the query sees)."),
    as_json: bool = JsonOpt,
):
    """Why a query attends where it does: its score f_x(y) against every key it sees, split into
    the rank-1 terms σ_i (x·u_i)(y·v_i) of the head's B plus the bias (rotary heads: by rotation
    plane); terms and bias add up to the model's own score (a soft-capped head's before the cap, the
    capped score shown beside it)."""
    from attn_core.circuits import attribute_report
    from attn_core.sources import resolve

    loaded = resolve(name)
    check_head(loaded, layer, head)
    ids = input_tokens(loaded, tokens, sample_seed, random_seed)
    doc = attribute_report(loaded, layer, head, len(ids) - 1 if query is None else query, ids, top=top)
    emit(doc, as_json, _attribute_text)
