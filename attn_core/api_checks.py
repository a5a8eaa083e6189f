"""The argument checks of the Python front door (:mod:`attn_core.api`, :mod:`attn_core.api_surgery`):
what a notebook passes that the CLI's options never let through (a float token id, a bool, a
list where one head goes, a numpy array, a 5000-character name) is refused here before any work,
in one ``ValueError``/``TypeError`` sentence that names the argument. The range checks are the
CLI's own (``validate``, ``limits``, ``bilinear.checks``, ``surgery``, ``destinations``): these
only make a notebook's values into what those checks take."""

from __future__ import annotations

from pathlib import Path

from attn_core.validate import integral, is_int, is_number, shown


def check_source(source: object, name: str = "source") -> str | Path:
    """``source`` when it is a str or Path (what :func:`attn_core.sources.resolve` reads)."""
    if not isinstance(source, (str, Path)):
        raise TypeError(
            f"{name} must name a model (a zoo name, a folder, run:<id> or upload: <name>: a str or a Path), "
            f"got {type(source).__name__}"
        )
    return source


def check_device(device: object) -> str:
    """``device`` (auto, cpu, cuda or cuda:<i>) when this machine has it, as torch names it; the
    check of the training jobs' device (``attn_core.device.select_device``)."""
    from attn_core.device import select_device

    if device is not None and not isinstance(device, str):
        raise TypeError(f"device must be auto, cpu or cuda (a str), got {type(device).__name__}")
    if device is not None and len(device) > 32:
        raise ValueError(f"unknown device {shown(device)}; use auto, cpu or cuda")
    return str(select_device(device))


def check_text(text: object, name: str = "text") -> str | Path | None:
    """``text`` (a file or folder of text) when it is None, a str or a Path."""
    if text is not None and not isinstance(text, (str, Path)):
        raise TypeError(f"{name} must be a text file or folder (a str or a Path), got {type(text).__name__}")
    try:
        None if text is None else Path(text).exists()
    except (OSError, ValueError) as e:  # a name the file system cannot hold
        raise ValueError(f"{name} {shown(str(text))} cannot be read ({getattr(e, 'strerror', None) or e})") from None
    return text


def check_token_ids(tokens: object, name: str = "text_or_tokens") -> list[int]:
    """Token ids as ints: a list, tuple or 1-d array of integers (bools and floats are no token ids)."""
    if hasattr(tokens, "tolist") and getattr(tokens, "ndim", 1) == 1:
        tokens = tokens.tolist()
    if not isinstance(tokens, (list, tuple, range)):
        raise TypeError(f"{name} must be a text (a str) or token ids (a list of integers), got {shown(tokens)}")
    tokens = [integral(t) for t in tokens]
    bad = [t for t in tokens if not is_int(t)]
    if bad:
        raise TypeError(f"{name} holds {shown(bad[0])}, which is not a token id (an integer)")
    return [int(t) for t in tokens]


def edit_head(head: object, loaded) -> tuple[int, int]:
    """(layer, head) of ``"L1H0"`` or a ``(layer, head)`` pair of integers; the range is checked by
    the edit (``surgery.check_edit``)."""
    from attn_core.surgery import parse_head

    if isinstance(head, str):
        if len(head) > 32:  # no head's name is this long: named, not echoed
            raise ValueError(f"head {shown(head)} is not one L<layer>H<head> (e.g. L1H0)")
        return parse_head(head, loaded.config, loaded.name)
    if isinstance(head, tuple) and len(head) == 2 and all(is_int(integral(x)) for x in head):
        return int(integral(head[0])), int(integral(head[1]))
    raise TypeError(
        f"head must be 'L<layer>H<head>' (e.g. 'L1H0') or a (layer, head) pair of integers, got {shown(head)}"
    )


def indices(name: str, value: object) -> tuple[int, ...]:
    """Indices (mode indices, layers) given as a list, tuple or 1-d array of integers."""
    if hasattr(value, "tolist") and getattr(value, "ndim", 1) == 1:
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        value = [integral(i) for i in value]
    if not isinstance(value, (list, tuple, range)) or not all(is_int(i) for i in value):
        raise TypeError(f"{name} must be a list of integers, got {shown(value)}")
    return tuple(int(i) for i in value)


def mode_scales(scale: object) -> tuple[tuple[int, float], ...]:
    """``{mode: factor}`` as the edit's sorted (mode, factor) pairs: integer modes, finite factors."""
    if scale is None:
        return ()
    if not isinstance(scale, dict):
        raise TypeError(f"scale must be a dict of mode index to factor (e.g. {{0: 2.0}}), got {shown(scale)}")
    for i, f in scale.items():
        if not is_int(i):
            raise TypeError(f"scale's mode index {shown(i)} is not an integer")
        if not is_number(f):
            raise ValueError(f"scale's factor for mode {i} must be a finite number, got {shown(f)}")
    return tuple(sorted((int(i), float(f)) for i, f in scale.items()))


def positions(name: str, value: object) -> tuple[int, int] | None:
    """Positions ``(A, B)`` (from A up to, not including, B) as a pair of integers, or None (the
    default); their range is checked with the inputs (``dynamics.metrics.check_positions``)."""
    if value is None:
        return None
    if hasattr(value, "tolist") and getattr(value, "ndim", 1) == 1:
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(is_int(i) for i in value):
        raise TypeError(f"{name} must be positions (A, B), a pair of integers, got {shown(value)}")
    return int(value[0]), int(value[1])
