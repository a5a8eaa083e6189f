"""What a refusal of bad input looks like from Python: one of the four exception types a library's
bad argument raises, one line of at most MAX_LINE characters, naming the argument. Shared by the
table walk (tests/unit/test_api_hostile.py) and the replay (tests/unit/test_api_replay.py)."""

import re

import pytest

ALLOWED = (ValueError, TypeError, KeyError, IndexError)
MAX_LINE = 400  # characters: a refusal echoes a 5000-character name or a 400-digit number cut short


def refuses(call, *names: str) -> str:
    """``call()`` raises one of :data:`ALLOWED` whose message is one line naming one of ``names``."""
    with pytest.raises(Exception) as info:
        call()
    e = info.value
    assert isinstance(e, ALLOWED), f"{type(e).__name__}: {str(e)[:600]}"
    msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    assert msg and "\n" not in msg and len(msg) <= MAX_LINE, msg[:600]
    assert any(re.search(rf"(?<![A-Za-z_]){re.escape(n)}", msg) for n in names), f"{names} not in: {msg}"
    return msg
