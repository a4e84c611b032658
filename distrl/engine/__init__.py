"""The IMPALA engine: one rollout from env step to gradient, in five files read in order.

1. ``storage.py``  The slot a rollout lives in: ``RolloutLayout`` names each row's keys (what the
                   actor writes at row t, what the env step gave, what is per slot) and the rows
                   the learner reads (``STEPS`` = 0..T-1, ``BOOTSTRAP`` = T). Shared-memory
                   ``RolloutStorage`` with free/full slot-index queues.
2. ``actor.py``    An actor process steps ``envs_per_actor`` envs (``distrl.envs``) with one
                   batched forward pass of the shared-memory actor copy of the network
                   (``distrl.policy``), writes each env's unroll into its own slot, and puts the
                   slot on the full queue at row T.
3. ``learner.py``  A learner thread takes B full slots, gathers a ``[T+1, B]`` batch, frees the
                   slots, runs the network on it, computes the loss and steps the optimizer,
                   then publishes the weights into the actors' copy (``policy.publish``).
4. ``../vtrace.py``  V-trace targets and the loss terms (pure tensor functions).
5. ``../policy.py``  The network, its actor and learner copies, and ``publish``.

Around the data path: ``pipes.py`` is the queues between processes (safe against a process
killed at any moment); ``placement.py`` resolves the ``auto`` sizes (actors, envs, slots,
threads, cores); ``supervisor.py`` starts, watches, restarts and stops actors and learner threads;
``schedule.py`` says when to log, evaluate and save; ``evaluator.py`` plays evaluation
episodes; ``trainer.py`` (``DistributedTrainer``) builds the run and drives the schedule.
Data flows one way: config -> trainer -> (storage, actors, learners) -> checkpoints, metrics.
"""
