"""A retrain: the live job that trains a declared run (``training.config.JobConfig``) from its
parent, in a thread, a worker process or on Ray Train workers, and publishes what it measures.

- ``parent``: what a run starts from (a zoo model, a folder, ``run:<id>``, a preset's fresh init)
  and what text and imported models add (the text task, ``--train``, ``--kl``);
- ``job``: the live job (``TrainingJob``, ``preview``);
- ``worker_process``: the worker's side of a job in a worker process (``training.worker``).

It stands above ``training`` (the loop), ``text``, ``presets`` and ``distributed``, which it hands
what they need. Import from the modules themselves: this package imports nothing.
"""
