"""Ray for this lab: how it starts or joins a cluster (:mod:`attn_core.cluster.session`, the one
place every command and page that uses Ray goes through) and the watchdog that ends a local Ray
with its driver (:mod:`attn_core.cluster.watchdog`). Imports no Ray until a session starts."""

from attn_core.cluster.session import (
    RAY_DEFAULTS,
    USAGE_STATS_ENV,
    ClusterError,
    address_of,
    check_reachable,
    end_ray,
    preflight,
    ray_module,
    ray_session,
    ray_users,
)

__all__ = [
    "RAY_DEFAULTS",
    "USAGE_STATS_ENV",
    "ClusterError",
    "address_of",
    "check_reachable",
    "end_ray",
    "preflight",
    "ray_module",
    "ray_session",
    "ray_users",
]
