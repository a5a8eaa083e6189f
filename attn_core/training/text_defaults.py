"""The numbers a text task's defaults come from: the held-out share, the block length and the
default batch's bound. Read by the task (``attn_core.text.task``) and by the CLI's help, so they
import nothing heavy."""

HELD_OUT_FRACTION = 0.1  # of the stream, when no --eval-text is given
DEFAULT_BLOCK = 256  # tokens per block, at most the model's context
MIN_BLOCK = 2
MAX_DEFAULT_BATCH = 64  # blocks per step of a text run whose batch size nobody gave (the toys' default)
STEP_MEMORY = 4 * 2**30  # bytes a default batch's training step is estimated to add (default_batch)
