"""The engine: one rollout from env step to gradient, read in order.

1. ``../envs/__init__.py`` ``VectorStepper.step``: one call steps every env of an actor (ale-py's
                          vector env or Gymnasium's).
2. ``actor.py``           ``act``: the actor acts on its envs with one batched forward pass of the
                          actor copy of the network (``distrl.nn.actor_critic.step_policy``, the one
                          loop step the actors and the evaluation share), and its ``SlotWriter``
                          writes each env's unroll into a slot and puts the slot on the full queue
                          once it reaches row T.
3. ``storage.py``         The slots in shared memory (their rows: ``../rollout.py``'s
                          ``RolloutLayout``; the loss reads ``STEPS`` = 0..T-1 and ``BOOTSTRAP`` = T),
                          their indices on the kill-safe queues of ``queues.py`` (with ``Channels``:
                          the episode, error and log queues and the shared numbers of a run), and a
                          learner thread's ``BatchSource``: ``take_full_slots`` (B of them),
                          ``get_batch`` (one ``[T+1, B]`` batch, the slots freed), beside the update
                          with ``train.prefetch``.
4. ``learner.py``         ``run_learner_thread``: the next batch, ``Learner.update`` (epochs of
                          minibatches, an optimizer step on the agent's loss for each, the weights
                          published to the actors' copy: ``distrl.nn.actor_learner``).
5. ``../agents/appo.py``   The agent's loss on a (mini)batch (APPO's, the default; IMPALA's in
                          ``impala.py``), on the targets of ``base.py`` (V-trace, whose tensor
                          functions are ``vtrace.py``).

The network these files call (``distrl.nn``: the encoder, ``actor_critic.py``) and its two copies
(``actor_learner.py``: the actors' in shared memory, the learner's) hold no rollout. The
life of a slot::

    free queue --actor takes it--> actor writes rows 0..T --full queue--> learner takes B of them
        ^                                                                        |
        +--------------- learner frees them once the batch is copied out ---------+

(A slot held by an actor that dies goes back to the free queue: ``supervisor.py``.)

Around the data path: ``supervisor.py`` starts, watches, restarts and stops the
actors and learner threads; ``schedule.py`` derives everything from the update count (agent
steps, the learning rate, the entropy cost) and says when to log, evaluate and save;
``evaluator.py`` plays evaluation episodes in the background; ``trainer.py``
(``Trainer``) builds the run and drives the schedule loop, with ``checkpointing.py``,
``reporting.py`` and ``shutdown.py``; ``distributed.py`` joins several ranks; ``logs.py`` carries
the actors' log records. The ``auto`` sizes come from :mod:`distrl.config.placement`. Data flows
one way: config -> trainer -> (storage, actors, learners) -> checkpoints, metrics.
"""
