"""Running statistics the continuous-control protocols rely on: observation normalisation, reward
scaling by the running standard deviation of the discounted return, and value targets normalised by
their running mean and standard deviation.

:class:`RunningMeanStd` keeps a running mean and variance in buffers of the network, so that one
set of statistics per run is published to the actors with the weights
(:meth:`distrl.nn.actor_learner.ActorLearner.publish`), saved in checkpoints and frozen
during evaluation (nothing updates them but the learner). The learner updates them from every batch
(:meth:`update` with the batch's moments; with several ranks the moments are summed across ranks first,
so every rank keeps the same statistics). The merge of two sets of moments is Chan et al. 1979
("Updating formulae and a pairwise algorithm for computing sample variances"), as Gymnasium's
``NormalizeObservation`` and OpenAI Baselines' ``RunningMeanStd`` compute it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from distrl.rollout import STEPS


class RunningMeanStd(nn.Module):
    """Running mean and variance of a stream of ``[N, *shape]`` samples.

    Args:
        shape: one sample's shape (``()`` for scalars).
        clip: normalised values are clipped to ``[-clip, clip]`` (CleanRL and Gymnasium's wrappers: 10).
        epsilon: added to the variance before the square root.
        prior_count: the weight of the prior moments (mean 0, variance 1): Baselines' 1e-4 for the
            observations and returns; 0 for the intrinsic rewards' statistics, which the first batch sets.

    Buffers (float64 for the sums' precision over millions of samples): ``mean [*shape]``,
    ``var [*shape]``, ``count []``.
    """

    def __init__(self, shape: tuple[int, ...] = (), clip: float = 10.0, epsilon: float = 1e-8,
                 prior_count: float = 1e-4):
        super().__init__()
        self.clip, self.epsilon = clip, epsilon
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(prior_count, dtype=torch.float64))

    @property
    def std(self) -> torch.Tensor:
        """``sqrt(var)``, float32 ``[*shape]``."""
        return self.var.sqrt().float()

    def update_from(self, samples: torch.Tensor) -> None:
        """Merge ``[N, *shape]`` ``samples`` (any leading dimensions) into the statistics, on this rank alone."""
        self.update(self.moments(samples, self.mean.dim()))

    @staticmethod
    def moments(samples: torch.Tensor, ndim: int) -> torch.Tensor:
        """``[count, sum x, sum x^2]`` over all but the last ``ndim`` dimensions of ``samples``, as one
        float64 tensor ``[3, *shape]`` (summable across ranks)."""
        x = samples.double().reshape(-1, *samples.shape[samples.dim() - ndim:])
        count = torch.full_like(x[0], float(x.shape[0]))
        return torch.stack([count, x.sum(0), (x * x).sum(0)])

    def merge(self, samples: torch.Tensor, sum_across_ranks: Callable[[torch.Tensor, object], None] | None = None,
              stop: object = None) -> None:
        """Merge a batch's ``[N, *shape]`` ``samples`` (any leading dimensions) into the statistics; with
        several ranks ``sum_across_ranks(moments, stop)`` first sums the batch's :meth:`moments` across
        them in place, so every rank merges the same statistics (None: one rank)."""
        moments = self.moments(samples, self.mean.dim())
        if sum_across_ranks is not None:
            sum_across_ranks(moments, stop)
        self.update(moments)

    @torch.no_grad()
    def update(self, moments: torch.Tensor) -> None:
        """Merge a batch's :meth:`moments` into the statistics."""
        count = moments[0].reshape(-1)[0]
        if count <= 0:
            return
        mean = moments[1] / count
        var = (moments[2] / count - mean * mean).clamp(min=0.0)
        delta = mean - self.mean
        total = self.count + count
        self.mean += delta * count / total
        self.var.copy_((self.var * self.count + var * count + delta * delta * self.count * count / total) / total)
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``clip((x - mean) / sqrt(var + eps))``, in ``x``'s float dtype."""
        mean = self.mean.to(x.dtype)
        std = torch.sqrt(self.var + self.epsilon).to(x.dtype)
        return ((x - mean) / std).clamp(-self.clip, self.clip)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """``clip(x) * sqrt(var + eps) + mean``: the inverse of :meth:`normalize` on ``[-clip, clip]``,
        in ``x``'s float dtype (Sample Factory's ``RunningMeanStdInPlace(denormalize=True)`` clips first too)."""
        std = torch.sqrt(self.var + self.epsilon).to(x.dtype)
        return x.clamp(-self.clip, self.clip) * std + self.mean.to(x.dtype)

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """``clip(x / sqrt(var + eps))``: scaled, not centred (reward scaling)."""
        return (x / torch.sqrt(self.var + self.epsilon).to(x.dtype)).clamp(-self.clip, self.clip)


def normalize_batch(net: nn.Module, batch: dict[str, torch.Tensor],
                    sum_across_ranks: Callable[[torch.Tensor, object], None] | None = None,
                    stop: object = None) -> dict[str, torch.Tensor]:
    """Update the running statistics of ``net`` (an :class:`distrl.nn.actor_critic.ActorCritic`:
    ``obs_norm`` with ``model.normalize_obs``, ``return_norm`` with ``agent.normalize_rewards``) from
    the T steps of a ``[T+1, B]`` ``batch`` (row T is the next slot's row 0), and return the batch the
    loss sees: with ``return_norm``, its rewards divided by the discounted return's running std.

    ``sum_across_ranks(moments, stop)``: with several ranks, sums each batch's moments across them
    in place first, so every rank merges the same statistics; None: one rank."""
    for norm, key in ((net.obs_norm, "obs"), (net.return_norm, "discounted_return")):
        if norm is None:
            continue
        norm.merge(batch[key][STEPS], sum_across_ranks, stop)
    if net.return_norm is not None:
        batch = {**batch, "reward": net.return_norm.scale(batch["reward"])}
    return batch


def value_statistics() -> RunningMeanStd:
    """The running statistics of the value targets (``agent.normalize_values``), at Sample Factory 2.1.1's
    values (``sample_factory/algo/utils/running_mean_std.py``): normalised targets clipped to [-5, 5],
    epsilon 1e-5, a prior of one sample of mean 0 and variance 1."""
    return RunningMeanStd((), clip=5.0, epsilon=1e-5, prior_count=1.0)


def normalize_value_targets(net: nn.Module, batch: dict[str, torch.Tensor],
                            sum_across_ranks: Callable[[torch.Tensor, object], None] | None = None,
                            stop: object = None) -> dict[str, torch.Tensor]:
    """With ``agent.normalize_values`` (``net.value_norm``, a :func:`value_statistics`), the batch's value
    targets normalised, once per batch before the first optimizer step: the statistics updated from the
    raw extrinsic targets ``batch["value_targets"][..., 0]`` (``[T, B]``, the return estimator's on the
    denormalised values, :class:`distrl.learning.losses.returns.NormalizedValues`), then those targets
    replaced by ``clip((v - mean) / sqrt(var + eps), -5, 5)`` with the new statistics, as Sample Factory's
    learner does (``_prepare_batch``: the returns normalised in place after GAE). The critic regresses
    these; its outputs are normalised values. ``batch`` itself without the statistics.

    ``sum_across_ranks(moments, stop)``: as for :func:`normalize_batch`."""
    norm = net.value_norm
    if norm is None:
        return batch
    targets = batch["value_targets"]
    norm.merge(targets[..., 0], sum_across_ranks, stop)
    normalized = torch.cat([norm.normalize(targets[..., :1]), targets[..., 1:]], dim=-1)
    return {**batch, "value_targets": normalized}
