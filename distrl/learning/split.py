"""One optimizer step's network work split into parts of the minibatch, run on a pool of threads.

With ``learner_split=N`` the learner (:mod:`distrl.learning.learner`) runs the network's forward and
backward pass on ``N`` parts of each minibatch (its unrolls, or its steps, split along ``B``) on
``learner_threads`` Python threads of one torch thread each, instead of running each operator on
``learner_threads`` torch threads. The agent's loss still sees the whole minibatch: the parts'
outputs are joined, the loss and its gradient with respect to those outputs computed once, and each
part's backward pass then gives its share of the parameters' gradient, summed in the parts' order.
The arithmetic is the unsplit step's but for the order of that sum (and each convolution's sum over
its rows): the gradients agree within float rounding.

Why: a learner that shares its cores with actor processes. A torch operator on several threads
splits its work among them and waits for the last, once per operator; a part is the forward and
backward pass of a slice of the minibatch, so the threads meet twice per optimizer step. Measured
on 2 cores (Pong, APPO, one actor pinned to a core): 2 parts on 2 threads made 1.06x the agent
steps per second of 2 torch threads unsplit and 1.26x one thread; 4 parts 1.00x and 1.19x
(docs/lab/benchmarks.md, "APPO at the 2-core limit").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from distrl.config.placement import Placement
from distrl.rollout import declared

Forward = Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, ...]]
LossOf = Callable[..., tuple]


class SplitStep:
    """The network's forward and backward pass on ``parts`` parts of a minibatch, on ``threads`` threads.

    Args:
        parts: how many parts a minibatch is split into along its ``B`` dimension (at most its
            ``B``: a minibatch of fewer unrolls or steps is split into that many).
        threads: the threads that run the parts, each part on one; each thread's operators run
            on one torch thread (the process's ``torch.set_num_threads``, set by the trainer).
    """

    def __init__(self, parts: int, threads: int):
        self.parts = parts
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="learner-part")

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def loss_and_gradients(self, forward: Forward, loss_of: LossOf, batch: dict[str, torch.Tensor],
                           parameters: Sequence[torch.Tensor]) -> tuple:
        """The loss of ``batch`` and its gradient, left in the parameters' ``.grad`` as
        ``loss.backward()`` would (``None`` for a parameter the network did not use).

        Args:
            forward: the network on a (part of a) batch: ``(policy_params, values)`` and, with PFO,
                the encoder's pre-activations, each ``[rows, b, ...]`` with ``b`` the part's width.
            loss_of: the agent's loss of the whole batch from the joined outputs (a
                :class:`distrl.learning.losses.LossTerms`, or a tuple whose first term is the total).
            batch: a ``[rows, B]`` (mini)batch; every key whose unrolls are its dim 1 (all but a number
                per unroll, ``policy_version`` and ``env_id``: ``[B]``, unused by the network;
                :data:`distrl.rollout.KEYS`) is split along dim 1, as views (``[rows, B, ...]``, and
                ``core_h``/``core_c`` ``[1, B, H]``).
            parameters: the learner network's parameters, whose gradients are set.

        Returns:
            What ``loss_of`` returned; its total's ``backward`` has already run.
        """
        width = batch["obs"].shape[1]
        bounds = _bounds(width, min(self.parts, width))
        pieces = [{key: value[:, start:stop] for key, value in batch.items() if declared(key).unroll_dim == 1}
                  for start, stop in bounds]
        outputs = list(self.pool.map(forward, pieces))
        joined = [torch.cat([out[i].detach() for out in outputs], dim=1).requires_grad_()
                  for i in range(len(outputs[0]))]
        terms = loss_of(*joined)
        terms[0].backward()
        heads = [tensor.grad if tensor.grad is not None else torch.zeros_like(tensor) for tensor in joined]

        def backward(index: int) -> tuple[torch.Tensor | None, ...]:
            start, stop = bounds[index]
            return torch.autograd.grad(outputs[index], parameters,
                                       [head[:, start:stop] for head in heads], allow_unused=True)

        grads = list(self.pool.map(backward, range(len(bounds))))
        for i, parameter in enumerate(parameters):
            shares = [g[i] for g in grads if g[i] is not None]
            for share in shares[1:]:  # in place into the first part's fresh gradient, in the parts' order
                shares[0].add_(share)
            grad = shares[0] if shares else None
            if grad is not None and grad.stride() != parameter.stride():  # as backward's AccumulateGrad leaves it,
                grad = torch.empty_like(parameter).copy_(grad)  # in the parameter's layout (the fused Adam's need)
            parameter.grad = grad
        return terms


def split_step(placement: Placement) -> SplitStep | None:
    """The learner's :class:`SplitStep` for a run's placement, or None without a split
    (``learner_split=1``)."""
    return SplitStep(placement.learner_split, placement.learner_threads) if placement.learner_split > 1 else None


def torch_threads(split: SplitStep | None, learner_threads: int) -> int:
    """The learner process's ``torch.set_num_threads``: one per part's thread with a split, else
    ``learner_threads``."""
    return 1 if split is not None else learner_threads


def _bounds(width: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``[start, stop)`` ranges covering ``range(width)``, sizes differing by at most one."""
    edges = [round(i * width / parts) for i in range(parts + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))
