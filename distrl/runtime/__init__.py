"""The runtime: what runs the data path (:mod:`distrl.sampling`, :mod:`distrl.learning`) for one run.

- ``preflight.py``: before any process starts, the config checked and the env probed once
  (``validate``, ``compose_config``).
- ``trainer.py``: ``Trainer`` builds the run (the network's two copies, the optimizer, the learner),
  drives the schedule loop (log, evaluate, save when due) and shuts the run down; it holds its parts
  and calls them:
  ``checkpointer.py`` (``Checkpointer``: what a checkpoint holds, saving, resuming, best.pt),
  ``reporter.py`` (``Reporter``: episodes, losses, timings, dormant units, evaluations to the
  telemetry) and the supervisor's ``Watchdog`` (a run that consumes no agent step stops).
- ``supervisor.py``: ``Workers`` starts, watches, restarts and stops the actor processes and the
  learner threads.
- ``evaluator.py``: evaluation episodes, in a thread beside training or on demand.
- ``rundir.py``: a run's default directory.

The ``auto`` sizes come from :mod:`distrl.config.placement`. Data flows one way: config -> trainer
-> (slots, actors, learners) -> checkpoints, metrics.
"""
