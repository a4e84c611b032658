"""The runtime: what runs the data path (:mod:`distrl.sampling`, :mod:`distrl.learning`) for one run.

- ``preflight.py``: before any process starts, the config checked and the env probed once
  (``validate``, ``compose_config``).
- ``trainer.py``: ``Trainer`` builds the run (the network's two copies, the optimizer, the learner,
  the ``Checkpointer`` of ``checkpointer.py``: what a checkpoint holds, saving, resuming, best.pt)
  and serves the Python API (``train``, ``test``, ``save``, ``counters``).
- ``loop.py``: one ``train()`` call: ``TrainingLoop`` starts the slots, actors and learner threads,
  drives the schedule loop (log, evaluate, save when due) and shuts the run down, calling its parts:
  the ``Reporter`` of ``reporter.py`` (episodes, losses, timings, dormant units, evaluations to the
  telemetry), the supervisor's ``Watchdog`` (a run that consumes no agent step stops), the
  checkpointer.
- ``supervisor.py``: ``Workers`` starts, watches, restarts and stops the actor processes and the
  learner threads.
- ``evaluator.py``: evaluation episodes, in a thread beside training or on demand.
- ``rundir.py``: a run's default directory.

The ``auto`` sizes come from :mod:`distrl.config.placement`. Data flows one way: config -> trainer
-> (slots, actors, learners) -> checkpoints, metrics.
"""
