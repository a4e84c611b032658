"""Sampling, the data path's first half: envs stepped by the behaviour policy, each env's unroll
written into a slot in shared memory, the slot handed to the learners. Read in this order:

1. ``stepper.py`` ``VectorStepper``: one ``send``/``recv`` steps every env of an actor (the vector
   envs :mod:`distrl.envs` builds: ale-py's or Gymnasium's).
2. ``policy.py``  ``step_policy``: one batched forward pass of the actors' copy of the network for
   those envs (the loop step the actors and evaluation share), ``AgentState`` what one step hands
   the next.
3. ``actor.py``   ``run_actor``/``act``: the actor process's loop over 1 and 2 and 4.
4. ``writer.py``  ``SlotWriter``: each env's step written into that env's slot (rows laid out by
   ``../rollout.py``), the slot's index put on the full queue once it holds T steps and the
   bootstrap row; ``Episodes`` reports the finished episodes.
5. ``slots.py``   the slots in shared memory (``Slots``) and what the trainer shares with
   its actor processes (``Channels``: the free and full queues of slot indices, the episode, error
   and log queues); the queues themselves are ``queues.py``'s (kill-safe pipes), and the actors'
   log records travel through ``logs.py``.

The learners take it from there (:mod:`distrl.learning`). The life of a slot::

    free queue --actor takes it--> actor writes rows 0..T --full queue--> learner takes B of them
        ^                                                                        |
        +--------------- learner frees them once the batch is copied out ---------+

(A slot held by an actor that dies goes back to the free queue: :mod:`distrl.runtime.supervisor`.)
"""
