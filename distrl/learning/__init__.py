"""Learning, the data path's second half: B full slots become a batch, the batch an update, the
update new weights for the actors. Read in this order:

1. ``batches.py``  ``BatchSource.next``: B full slot indices from the full queue, copied into one
   ``[T+1, B]`` batch on the learner's device and freed (with ``train.prefetch``, one batch ahead
   in a thread of its own).
2. ``thread.py``  ``run_learner_thread``: a learner thread's loop over 1 and 3 (and, with several
   ranks, the exchanges between updates); ``LearnerStats`` what it reports.
3. ``learner.py``  ``Learner.update``: the running statistics updated from the batch, the intrinsic
   rewards, the plan's preparation and optimizer steps, then the weights published into the actors'
   copy (:meth:`distrl.nn.actor_learner.ActorLearner.publish`) and the intrinsic module trained;
   ``make_learner`` assembles it from the config.
4. ``plan.py``  ``UpdatePlan``: the update's ``num_epochs x num_minibatches`` minibatches (whole
   unrolls or single steps) and what is computed once before the first step (the step targets,
   PFO's anchor).
5. ``step.py``  ``OptimizerStep``: the network's forward pass, the agent's loss, its gradient (whole,
   compiled, or in parts on threads: ``split.py``), the ranks' average, the clip and the step.
6. ``losses/base.py``  ``AgentLoss``: the stored actions scored by the action distribution
   (:mod:`distrl.nn.distributions`), the reward streams, the return estimator on each
   (``losses/returns.py``: V-trace, GAE; the recursion in ``losses/vtrace.py``) and the objective
   (``losses/appo.py``'s clipped surrogate, or ``losses/impala.py``'s policy gradient).

Beside them: ``schedule.py`` derives everything from the learner's update count (agent steps, the
learning rate, the entropy cost, the intrinsic reward's weight); ``distributed.py`` averages
gradients and sums statistics across ranks (``torchrun``).
"""
