# TRANSITIONAL re-export: removed at integration
"""The old ``attn_core.qk_compare``: its names now live in ``attn_core.qk``."""
from attn_core.qk import *  # noqa: F403
from attn_core.qk import __all__  # noqa: F401
from attn_core.qk.result import _finite, _mean_std  # noqa: F401
