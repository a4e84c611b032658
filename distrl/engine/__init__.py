"""The engine: one rollout from env step to gradient, read in order.

1. ``../rollout.py``      The slot a rollout lives in: ``RolloutLayout`` names each row's keys (what
                          the actor writes at row t, what the env step gave, what is per slot) and
                          the rows the loss reads (``STEPS`` = 0..T-1, ``BOOTSTRAP`` = T).
2. ``actor.py``           ``act``: an actor process steps ``envs_per_actor`` envs, acts on them with
                          one batched forward pass of the actor copy of the network
                          (``distrl.nn.actor_critic.step_policy``, the one loop step the actors and
                          the evaluation share), and its ``SlotWriter`` writes each env's unroll into
                          a slot of ``storage.py``'s shared memory and puts the slot on the full
                          queue once it reaches row T.
3. ``actor_learner.py``   The actor copy of the network (shared memory, read by the actors) and the
                          learner copy, and ``publish`` from one to the other.
4. ``learner.py``         ``run_learner_thread``: ``take_full_slots`` (B of them), ``get_batch`` (one
                          ``[T+1, B]`` batch, the slots freed), ``Learner.update`` (epochs of
                          minibatches, an optimizer step on the agent's loss for each, the weights
                          published to the actors' copy).
5. ``../agents/``         The agent's loss on a (mini)batch: ``base.py`` (V-trace's targets), then
                          ``impala.py`` or ``appo.py``; ``vtrace.py`` the pure tensor functions.

The env step is one call into ``distrl.envs`` (``VectorStepper``: ale-py's vector env or
Gymnasium's); a slot index crosses processes through ``shared.py``'s queues. The life of a slot::

    free queue --actor takes it--> actor writes rows 0..T --full queue--> learner takes B of them
        ^                                                                        |
        +--------------- learner frees them once the batch is copied out ---------+

(A slot held by an actor that dies goes back to the free queue: ``supervisor.py``.)

Around the data path: ``shared.py`` the queues and numbers shared with the actor processes (safe
against a process killed at any moment); ``supervisor.py`` starts, watches, restarts and stops the
actors and learner threads; ``schedule.py`` derives everything from the update count (agent
steps, the learning rate, the entropy cost) and says when to log, evaluate and save;
``evaluator.py`` plays evaluation episodes in the background; ``trainer.py``
(``DistributedTrainer``) builds the run and drives the schedule loop, with ``checkpointing.py``,
``reporting.py`` and ``shutdown.py``; ``distributed.py`` joins several ranks; ``logs.py`` carries
the actors' log records. The ``auto`` sizes come from :mod:`distrl.config.placement`. Data flows
one way: config -> trainer -> (storage, actors, learners) -> checkpoints, metrics.
"""
