"""The composition kinds and the random baseline's default sample count: constants of
``attn_core.circuits.composition`` that the CLI's help shows, kept apart from its torch code."""

KINDS = ("q", "k", "v")  # Q-, K- and V-composition
N_SAMPLES = 64  # random matrix pairs per shape of the composition baseline
