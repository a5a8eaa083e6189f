"""A retrain on several workers, on Ray Train (``attn-lab retrain --workers N``; see
docs/architecture.md, "Retraining on workers"): the same ``TrainingJob``, run by N ranks. The
settings a JobConfig records (workers, GPUs per worker, ddp or fsdp) are ``training.scaling``'s.

``parallel`` (one rank: the batch split and weighted, values averaged, DDP or FSDP, rank 0 leads
and the others replay, weights gathered on rank 0), ``rank`` (what each Ray Train worker runs),
``remote`` (the driver's side: Ray Train's TorchTrainer, the channel, failures). Ray itself is
started or joined by :mod:`attn_core.cluster`."""
