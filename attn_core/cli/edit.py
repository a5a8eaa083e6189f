"""``edit`` (surgery on heads' B, no retraining: ``attn_core.surgery``) and ``diff`` (which head
of model A is which head of model B, from B alone)."""

from __future__ import annotations

from pathlib import Path

import typer

from attn_core.cli.common import JsonOpt, NameArg, command_line, emit, fail, guarded, table

app = typer.Typer()

GROUP_OPTIONS = ("--head", "--rank", "--drop-modes", "--scale-modes", "--sink", "--ablate", "--from", "--with-ov")
METRICS = ("loss", "perplexity", "accuracy", "icl_score", "sink_rate")


def _split(args: list[str]) -> list[tuple[str, str | None]]:
    """The group options in the order given: (option, value); ``--opt=value`` too."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        opt, eq, value = arg.partition("=")
        if opt not in GROUP_OPTIONS:
            raise ValueError(f"unexpected argument {arg!r}: edit takes NAME first, then --head groups (see --help)")
        if opt == "--with-ov":
            if eq:
                raise ValueError("--with-ov takes no value")
            out.append((opt, None))
            i += 1
            continue
        if not eq:
            if i + 1 >= len(args):
                raise ValueError(f"{opt} needs a value")
            value, i = args[i + 1], i + 1
        out.append((opt, value))
        i += 1
    return out


def _int(opt: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{opt} takes whole numbers, got {text!r}") from None


def _scales(text: str) -> tuple[tuple[int, float], ...]:
    out = []
    for part in text.split(","):
        i, eq, f = part.partition("=")
        if not eq:
            raise ValueError(f"--scale-modes takes I=F items (e.g. 0=0.5,2=0), got {part!r}")
        try:
            out.append((_int("--scale-modes", i.strip()), float(f)))
        except ValueError as e:
            raise ValueError(str(e) if "whole" in str(e) else f"--scale-modes: {f!r} is not a number") from None
    return tuple(out)


def _source(text: str) -> tuple[str, str | None]:
    """SOURCE[:LxHy] as (source, head text or None); a run:<id> keeps its colon."""
    base, sep, tail = text.rpartition(":")
    low = tail.lower()
    if sep and base and low.startswith("l") and "h" in low and low[1:].replace("h", "", 1).isdigit():
        return base, tail
    return text, None


def parse_groups(args: list[str], cfg, resolve_source, name: str = "the model") -> tuple[list, dict]:
    """HeadEdits from the group options (each ``--head`` starts a group) of model ``name`` (of
    config ``cfg``) and the sources loaded."""
    from attn_core.surgery import HeadEdit, parse_head

    groups: list[dict] = []
    sources: dict = {}
    for opt, value in _split(args):
        if opt == "--head":
            layer, head = parse_head(value, cfg, name)
            groups.append(dict(layer=layer, head=head))
            continue
        if not groups:
            raise ValueError(f"{opt} must follow the --head it applies to (e.g. --head L1H0 {opt} ...)")
        g = groups[-1]
        keys = {
            "--rank": "rank",
            "--drop-modes": "drop",
            "--scale-modes": "scale",
            "--ablate": "ablate",
            "--sink": "sink",
        }
        key = keys.get(opt, opt)
        if key in g or (opt == "--from" and "source" in g):
            raise ValueError(f"{opt} is given twice for head L{g['layer']}H{g['head']}")
        if opt == "--rank":
            g["rank"] = _int(opt, value)
        elif opt == "--drop-modes":
            g["drop"] = tuple(_int(opt, v.strip()) for v in value.split(","))
        elif opt == "--scale-modes":
            g["scale"] = _scales(value)
        elif opt == "--sink":
            try:
                g["sink"] = float(value)
            except ValueError:
                raise ValueError(
                    f"--sink takes a number (the factor on the head's sink logit; 0 zeroes it), got {value!r}"
                ) from None
        elif opt == "--ablate":
            g["ablate"] = value
        elif opt == "--from":
            name, head_text = _source(value)
            if name not in sources:
                sources[name] = resolve_source(name)
            g["source"] = name
            if head_text is not None:
                g["source_head"] = parse_head(head_text, sources[name].config, sources[name].name)
        else:
            g["with_ov"] = True
    if not groups:
        raise ValueError("no edit given: name a head with --head L<layer>H<head> and what to do to it")
    for g in groups:
        if g.get("with_ov") and "source" not in g:
            raise ValueError(f"--with-ov needs --from for head L{g['layer']}H{g['head']}")
        if len(g) == 2:
            raise ValueError(
                f"head L{g['layer']}H{g['head']} is given nothing to do: add --rank, --drop-modes, --scale-modes, "
                "--sink, --ablate or --from"
            )
    return [HeadEdit(**g) for g in groups], sources


def _human(r: dict) -> str:
    rows = [dict(metric=k, before=r["before"][k], after=r["after"][k]) for k in METRICS]
    for head, v in r["after"]["heads"].items():
        for k in ("entropy", "sigma_1", "sink", "sink_share"):
            if k not in v:
                continue
            rows.append(dict(metric=f"{head} {k}", before=r["before"]["heads"][head][k], after=v[k]))
    edits = "; ".join(" ".join(f"{k}={v}" for k, v in e.items()) for e in r["edits"])
    out = f"\nsaved: {r['out']['out']} ({r['out']['format']})" if r.get("out") else ""
    return f"{r['name']}: {edits}\n" + table(rows, ["metric", "before", "after"]) + f"\ninputs: {r['inputs']}" + out


@app.command(
    "edit", context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": True}
)
@guarded
def edit_cmd(
    ctx: typer.Context,
    name: str = NameArg,
    text: Path | None = typer.Option(None, "--text", help="Measure on windows of this text (default: task samples)."),
    samples: int = typer.Option(64, "--samples", help="Task samples or text windows measured on."),
    length: int | None = typer.Option(None, "--length", help="Tokens per text window (default 128, cut to context)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the task samples."),
    out: Path | None = typer.Option(None, "--out", help="Save the edited model here (a new folder)."),
    as_json: bool = JsonOpt,
):
    """Edit heads' B without retraining and measure before/after. NAME first, then one group per
    head: --head L1H0 followed by any of --rank R (keep the R strongest modes), --drop-modes I,J,
    --scale-modes I=F,..., --sink F (its learned sink logit times F; 0 zeroes it), --ablate zero|mean, --from SOURCE[:LxHy] (transplant W_Q, W_K from a
    model of the same shape) and --with-ov (W_V, W_O too). Modes are B's singular pairs (rotary
    heads: rotation planes, as attribute splits them; MLA heads: their absorbed B's, written into
    the head's own W_UQ; QK-norm heads: their core's); the edit goes into the head's own W_Q (with
    QK-norm across heads, its slice of the q_norm weight; a per-head QK-norm takes --ablate and
    transplants only), so heads sharing its key/value head keep theirs. --out saves a folder every
    command opens (an
    imported model stays its Hugging Face family)."""

    try:  # a mistyped option is a usage error, refused before any model (or torch) is read
        if name.startswith("-"):
            raise ValueError(f"unexpected option {name!r} where NAME goes: edit takes NAME first, then --head groups")
        _split(list(ctx.args))
    except ValueError as e:
        fail(str(e), as_json)
    from attn_core.destinations import check_destination
    from attn_core.sources import resolve
    from attn_core.surgery import edit_inputs, edit_model, measure
    from attn_core.surgery.save import save_edited

    if out is not None:
        check_destination(out)
    loaded = resolve(name)
    edits, sources = parse_groups(list(ctx.args), loaded.config, resolve, loaded.name)
    inputs = edit_inputs(loaded, text, samples, length, seed)
    heads = list(dict.fromkeys((e.layer, e.head) for e in edits))
    edited = edit_model(loaded, edits, sources, tokens=inputs.tokens)
    result = dict(
        name=loaded.name,
        edits=[e.to_json() for e in edits],
        inputs=inputs.describe(),
        before=measure(loaded, inputs, heads, seed),
        after=measure(edited.loaded, inputs, heads, seed),
    )
    if out is not None:
        result["out"] = save_edited(loaded, edited, out, command_line(), result)
    emit(result, as_json, _human)


def _layers(text: str | None) -> list[int] | None:
    if text is None:
        return None
    return [_int("--layers", v.strip()) for v in text.split(",") if v.strip()] or None


def _human_diff(r: dict) -> str:
    rows = [
        dict(layer=p["layer"], head_a=p["head_a"], head_b=p["head_b"], distance=p["distance"])
        | ({"sink_change": p["sink_change"]} if "sink_change" in p else {})
        for p in r["pairs"]
    ]
    left = ", ".join(f"{r[u['model']]}:L{u['layer']}H{u['head']}" for u in r["unmatched"]) or "none"
    return f"{r['a']} vs {r['b']} ({r['distance']})\n" + table(rows, list(rows[0])) + f"\nunmatched: {left}"


@app.command("diff")
@guarded
def diff_cmd(
    a: str = typer.Argument(..., help="Model A (zoo name, folder, run:<id>)."),
    b: str = typer.Argument(..., help="Model B."),
    layers: str | None = typer.Option(None, "--layers", help="Layers to compare, e.g. 0,1 (default: all)."),
    as_json: bool = JsonOpt,
):
    """Which head of A is which head of B, from B alone (blind to how a head factors it): per
    layer the relative Frobenius distance ||B_a - B_b|| / (||B_a|| + ||B_b||) of every pair and
    the one-to-one matching of least total distance (whole key/value groups first under
    grouped-query attention); heads left over are named."""
    from attn_core.sources import resolve
    from attn_core.surgery import diff

    emit(diff(resolve(a), resolve(b), _layers(layers)).to_json(), as_json, _human_diff)
