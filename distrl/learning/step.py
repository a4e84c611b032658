"""One optimizer step on a minibatch (step 5 of :mod:`distrl.learning`): the learner network's forward
pass (:class:`NetworkForward`), the agent's loss on its outputs, the loss's gradient, the ranks'
average of it, the clip of its norm and the optimizer's step, skipped when the loss or the norm is
not finite (:class:`OptimizerStep`); :func:`run_steps` makes a plan's steps in order.

How the gradient is taken is chosen once (:func:`make_step`, from the run's :class:`StepOptions`): the
network and the loss in one pass (``loss.backward()``), the two compiled into one graph
(``train.th_compile``), or the network's work in parts of the minibatch on threads (``learner_split``,
:mod:`distrl.learning.split`); a user's own loss (:meth:`OptimizerStep.use_loss`; the seeds' adapter,
:mod:`distrl.compat.rllte`) in one pass.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from distrl.learning.distributed import Ranks
from distrl.learning.losses import AgentLoss, LossTerms, Outputs
from distrl.learning.split import SplitStep, split_step
from distrl.nn.precision import autocast
from distrl.rollout import Batch

LossOf = Callable[[Batch, float, float], LossTerms]  # (minibatch, entropy_cost, intrinsic_coef) -> terms
LOSS_NAMES = ("total", "policy", "value", "entropy", "grad_norm")
LAST_STEP_SCALARS = ("feature_drift",)  # reported from an update's last optimizer step, the rest from its first


class NetworkForward:
    """The learner network on every row of a (mini)batch (``[T+1, B]``, or a ``[1, n]`` minibatch of
    steps) with the run's ``precision`` (:func:`distrl.nn.precision.autocast` on ``device``). Its
    inputs are chosen once from the network: the LSTM state with a core, the previous action and
    reward with ``model.last_action_reward``; the encoder's pre-activations with ``preactivations``
    (PFO)."""

    def __init__(self, net: nn.Module, precision: str, device: torch.device, preactivations: bool):
        self.net, self.precision, self.device, self.preactivations = net, precision, device, preactivations
        self.core_keys = ("core_h", "core_c") if net.core is not None else ()
        self.last_keys = ("last_action", "last_reward") if net.last_action_reward else ()

    def tensors(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        """:class:`Outputs`' tensors on a ``[rows, B]`` (mini)batch: ``params [rows, B, P]`` float32 (the
        action distribution's parameters), ``values [rows, B]`` float32 (``[rows, B, 2]`` with an
        intrinsic value head) and, with PFO, the encoder's pre-activations ``[rows, B, F]`` in the
        autocast's dtype."""
        last = [batch[key] for key in self.last_keys] or [None, None]
        with autocast(self.precision, self.device):
            params, values, _, *preactivations = self.net(
                batch["obs"], batch["first"], tuple(batch[key] for key in self.core_keys), *last,
                with_preactivations=self.preactivations)
        return params, values, *preactivations

    def __call__(self, batch: Batch) -> Outputs:
        return Outputs(*self.tensors(batch))


@dataclass(frozen=True)
class StepOptions:
    """How a learner computes its steps (:func:`make_step`; :meth:`for_run` reads them from a run).

    Attributes:
        device: the learner copy's device.
        precision: ``bf16``: the network's forward under ``torch.autocast`` in bfloat16 (the weights,
            the optimizer state and the gradients stay fp32; the heads' outputs are cast back to fp32,
            so V-trace, the log-softmax, the importance ratios, the losses and the gradient clip are
            fp32); ``fp32``: no autocast.
        compile_mode: None: eager; else ``torch.compile`` the network's forward pass and the loss as
            one graph (their backward pass with them) in this mode: ``default``, ``reduce-overhead``
            (the forward and backward graphs replayed as CUDA graphs on a GPU; each optimizer step is
            then one step of torch's CUDA graph trees) or ``max-autotune``.
        split: the network's work of a step in parts on threads (:mod:`distrl.learning.split`; eager
            only, and not with a user's loss); None: one part.
    """

    device: torch.device
    precision: str = "fp32"
    compile_mode: str | None = None
    split: SplitStep | None = None

    @classmethod
    def for_run(cls, cfg, placement) -> StepOptions:
        """A train config's (``train.th_compile``, ``train.compile_mode``) on its placement (the
        device, the precision, the split: :class:`distrl.config.placement.Placement`)."""
        return cls(placement.device, placement.precision,
                   cfg.train.compile_mode if cfg.train.th_compile else None, split_step(placement))


class Gradients(NamedTuple):
    """How an optimizer step takes its gradient (chosen by :func:`make_step`).

    Attributes:
        take: ``(minibatch, entropy_cost, intrinsic_coef)`` -> the :class:`LossTerms`, their gradient
            left in the parameters' ``.grad``.
        loss_of: the network's loss of a minibatch, without the gradient (compiled with
            ``train.th_compile``; :attr:`OptimizerStep.loss_of`).
        split: the :class:`SplitStep` that ``take`` runs the network's work on, or None.
        begin: called before each step (torch's CUDA graph trees' step mark with ``reduce-overhead``).
    """

    take: LossOf
    loss_of: LossOf
    split: SplitStep | None = None
    begin: Callable[[], None] = lambda: None


class OptimizerStep:
    """One optimizer step (module docstring); made by :func:`make_step`.

    Args:
        forward: the learner network's pass.
        loss: the agent's loss.
        optimizer: over the network's parameters.
        max_grad_norm: the clip of the gradient's global norm (``agent.max_grad_norm``).
        ranks: with several ranks, gradients are averaged across them before every step
            (:mod:`distrl.learning.distributed`).
        gradients: how the gradient is taken (:class:`Gradients`).

    Attributes:
        parameters: the network's parameters (their gradients averaged, clipped, stepped).
    """

    def __init__(self, forward: NetworkForward, loss: AgentLoss, optimizer: torch.optim.Optimizer,
                 max_grad_norm: float, ranks: Ranks, gradients: Gradients):
        self.forward, self.loss, self.optimizer, self.ranks = forward, loss, optimizer, ranks
        self.max_grad_norm, self.gradients = max_grad_norm, gradients
        self.parameters = list(forward.net.parameters())

    @property
    def loss_of(self) -> LossOf:
        """The network's loss of a minibatch, ``(minibatch, entropy_cost, intrinsic_coef)`` ->
        :class:`LossTerms` (compiled with ``train.th_compile``): what a user's own loss builds on."""
        return self.gradients.loss_of

    @property
    def split(self) -> SplitStep | None:
        """The :class:`SplitStep` the gradient's network work runs on, or None."""
        return self.gradients.split

    def use_loss(self, loss_of: LossOf) -> None:
        """Take every later step's gradient from ``loss_of``, a user's loss of a minibatch (which may
        call :attr:`loss_of`, the network's), in one pass: never compiled or split itself."""
        self.gradients = self.gradients._replace(take=_backward(loss_of), split=None)

    def set_learning_rate(self, learning_rate: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate

    def __call__(self, minibatch: Batch, entropy_cost: float, intrinsic_coef: float,
                 stop: threading.Event | None = None) -> tuple[dict[str, float], bool]:
        """One optimizer step on ``minibatch``, skipped if the loss or the gradient norm is not finite.
        Returns ``{total, policy, value, entropy, grad_norm}`` (the norm before clipping) and the
        loss's diagnostics, floats, and whether the step was made. ``stop`` ends a wait for the other ranks."""
        self.gradients.begin()
        self.optimizer.zero_grad(set_to_none=True)
        terms = self.gradients.take(minibatch, entropy_cost, intrinsic_coef)
        if self.ranks.enabled:
            self.ranks.average_gradients(self.parameters, stop)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.max_grad_norm)
        diagnostics = terms.diagnostics or {}
        reported = [terms.total, terms.policy, terms.value, terms.entropy, grad_norm, *diagnostics.values()]
        values = torch.stack([term.detach().float() for term in reported]).tolist()  # one sync
        scalars = dict(zip((*LOSS_NAMES, *diagnostics), values, strict=True))
        finite = math.isfinite(scalars["total"]) and math.isfinite(scalars["grad_norm"])
        if finite:
            self.optimizer.step()
        return scalars, finite


def run_steps(step: OptimizerStep, minibatches: Iterable[Batch], entropy_cost: float, intrinsic_coef: float,
              stop: threading.Event | None = None) -> tuple[dict[str, float], int, bool]:
    """``step`` on each minibatch in order, up to the first non-finite one. Returns the scalars
    reported (the first step's, or those of the non-finite one; :data:`LAST_STEP_SCALARS` from the
    last step made: PFO's drift is 0 at the first step by construction), the steps made, and whether
    every step was finite."""
    for index, minibatch in enumerate(minibatches):
        scalars, finite = step(minibatch, entropy_cost, intrinsic_coef, stop)
        if index == 0 or not finite:
            reported = scalars
        else:
            reported.update({key: scalars[key] for key in LAST_STEP_SCALARS if key in scalars})
        if not finite:
            return reported, index, False
    return reported, index + 1, True


def _backward(of: LossOf) -> LossOf:
    """``of``, its total's ``backward`` run."""
    def take(minibatch: Batch, entropy_cost: float, intrinsic_coef: float) -> LossTerms:
        terms = of(minibatch, entropy_cost, intrinsic_coef)
        terms.total.backward()
        return terms
    return take


def make_step(forward: NetworkForward, loss: AgentLoss, optimizer: torch.optim.Optimizer, max_grad_norm: float,
              ranks: Ranks, options: StepOptions) -> OptimizerStep:
    """The :class:`OptimizerStep` of a run, its gradient taken the one way ``options`` asks for
    (:class:`StepOptions`: eager, compiled or split; ``options.precision`` and ``options.device`` are
    ``forward``'s)."""
    def network_loss(minibatch: Batch, entropy_cost, intrinsic_coef) -> LossTerms:
        return loss(minibatch, forward(minibatch), entropy_cost, intrinsic_coef)

    compile_mode, split = options.compile_mode, options.split
    loss_of: LossOf = network_loss
    if compile_mode is not None:  # its two floats as 0-d tensors: inputs of one graph, not constants
        compiled = torch.compile(network_loss, mode=None if compile_mode == "default" else compile_mode)
        device = forward.device

        def loss_of(minibatch: Batch, entropy_cost: float, intrinsic_coef: float) -> LossTerms:
            return compiled(minibatch, torch.tensor(entropy_cost, device=device),
                            torch.tensor(intrinsic_coef, device=device))

    begin = torch.compiler.cudagraph_mark_step_begin if compile_mode == "reduce-overhead" else (lambda: None)
    if split is None or compile_mode is not None:
        return OptimizerStep(forward, loss, optimizer, max_grad_norm, ranks,
                             Gradients(_backward(loss_of), loss_of, None, begin))
    parameters = list(forward.net.parameters())

    def in_parts(minibatch: Batch, entropy_cost: float, intrinsic_coef: float) -> LossTerms:
        return split.loss_and_gradients(
            forward.tensors, lambda *outputs: loss(minibatch, Outputs(*outputs), entropy_cost, intrinsic_coef),
            minibatch, parameters)

    return OptimizerStep(forward, loss, optimizer, max_grad_norm, ranks, Gradients(in_parts, loss_of, split, begin))
