"""What every intrinsic reward module shares: :class:`IntrinsicReward` (the rewards of a batch, their
normalisation, with :class:`distrl.nn.normalization.RunningMeanStd`, the checkpoint state) and the
random encoders (:func:`feature_net`). The decisions behind them are in :mod:`distrl.intrinsic`."""

from __future__ import annotations

import math
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from distrl.nn.normalization import RunningMeanStd
from distrl.rollout import STEPS
from distrl.utils.discounted import reverse_discounted_sum

NORMALIZATIONS = ("returns", "rewards")  # intrinsic.normalize: whose running std the rewards are divided by


def feature_net(obs_shape: tuple[int, ...], out_dim: int) -> nn.Module:
    """A random-initialised encoder to ``[N, out_dim]``, for ``[N, *obs_shape]`` float inputs.

    Images of at least 36 pixels a side: the convolutions of Burda et al. (2019, Appendix A.4; the
    Nature CNN's) with leaky ReLUs; smaller images (MiniGrid's 7 x 7): two 3 x 3 convolutions;
    vectors: two layers of 256 with leaky ReLUs. The last layer is linear.
    """
    if len(obs_shape) == 3:
        channels, height, width = obs_shape
        if min(height, width) >= 36:
            convs = [nn.Conv2d(channels, 32, 8, stride=4), nn.LeakyReLU(),
                     nn.Conv2d(32, 64, 4, stride=2), nn.LeakyReLU(),
                     nn.Conv2d(64, 64, 3, stride=1), nn.LeakyReLU()]
        else:
            convs = [nn.Conv2d(channels, 32, 3, padding=1), nn.LeakyReLU(),
                     nn.Conv2d(32, 64, 3, padding=1), nn.LeakyReLU()]
        trunk = nn.Sequential(*convs, nn.Flatten())
        with torch.no_grad():
            flat = trunk(torch.zeros(1, *obs_shape)).shape[1]
        return nn.Sequential(trunk, nn.Linear(flat, out_dim))
    if len(obs_shape) == 1:
        return nn.Sequential(nn.Linear(obs_shape[0], 256), nn.LeakyReLU(), nn.Linear(256, 256), nn.LeakyReLU(),
                             nn.Linear(256, out_dim))
    raise ValueError(f"observations of shape {tuple(obs_shape)}: an intrinsic reward needs [C, H, W] images "
                     "or flat vectors")


def encoder_inputs(obs: torch.Tensor, is_image: bool, newest_frame_only: bool) -> torch.Tensor:
    """``[N, *obs_shape]`` observations as an encoder's ``float32`` inputs: images scaled to [0, 1]
    (with ``newest_frame_only``, the last channel alone: the newest frame of a stack), vectors as they are."""
    if newest_frame_only:
        obs = obs[:, -1:]
    return obs.float().div(255.0) if is_image else obs.float()


def orthogonal_init(module: nn.Module) -> None:
    """Orthogonal weights with gain sqrt(2) and zero biases for every linear and convolutional layer
    (the initialisation of Burda et al. 2019's code)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(m.weight, gain=math.sqrt(2))
            nn.init.zeros_(m.bias)


class IntrinsicReward(nn.Module):
    """What every module does, for observations of ``obs_shape``.

    Args:
        obs_shape: one observation's shape, ``[C, H, W]`` (uint8 images) or ``[D]`` (vectors).
        cfg: the ``intrinsic`` config node.
        newest_frame_only: use only the last channel of an image (the newest frame of a stack).
        discount: the discount of the intrinsic returns whose std normalises RND's reward.
        episodic: those returns are cut at an episode's end (``intrinsic.episodic``).

    Raises:
        ValueError: observations that are neither images nor flat vectors.

    Attributes:
        actor_bonus: for a module whose rewards the actors compute (E3B), what they need
            (:class:`distrl.intrinsic.e3b.ActorBonus`); None for those the learner computes.
    """

    actor_bonus = None

    def __init__(self, obs_shape: tuple[int, ...], cfg: DictConfig, newest_frame_only: bool = False,
                 discount: float = 0.99, episodic: bool = False):
        super().__init__()
        self.is_image = len(obs_shape) == 3
        self.newest_frame_only = newest_frame_only and self.is_image
        self.input_shape = (1, *obs_shape[1:]) if self.newest_frame_only else tuple(obs_shape)
        self.discount = discount
        self.episodic = episodic
        self.cfg = cfg
        self.reward_rms = RunningMeanStd(prior_count=0.0)
        # intrinsic.obs_norm: the inputs' running mean and std per element (Burda et al. 2019, Section 2.4)
        self.obs_rms = RunningMeanStd(self.input_shape, prior_count=0.0) if cfg.obs_norm else None
        self.optimizer: torch.optim.Optimizer | None = None

    def inputs(self, obs: torch.Tensor, update_stats: bool = False) -> torch.Tensor:
        """``[N, *obs_shape]`` observations as the encoder's ``float32`` inputs ``[N, *input_shape]``
        (:func:`encoder_inputs`); with ``intrinsic.obs_norm``, standardised per element by the
        running statistics (first updated with these observations if ``update_stats``) and clipped
        to [-5, 5] (Burda et al. 2019, Section 2.4; an element that has not varied yet is 0)."""
        x = encoder_inputs(obs, self.is_image, self.newest_frame_only)
        if self.obs_rms is None:
            return x
        if update_stats:
            self.obs_rms.update_from(x)
        return ((x - self.obs_rms.mean.float()) / self.obs_rms.std.clamp_min(1e-8)).clamp(-5.0, 5.0)

    @torch.no_grad()
    def rewards(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The intrinsic rewards of a ``[T+1, B]`` batch's ``T`` steps: ``(raw, normalised)``, each
        ``[T, B] float32``; 0 where a step ends its episode. ``normalised`` is ``raw`` divided by
        the running std of :meth:`_scale`, then clipped at ``intrinsic.clip`` (null: not clipped).
        Updates the running statistics.

        The batch holds ``obs [T+1, B, ...]``, ``terminated`` and ``truncated [T+1, B] bool`` and,
        for the modules that keep something per environment, ``env_id [B] int64`` (the env that
        wrote each slot: :mod:`distrl.rollout`)."""
        obs = batch["obs"]
        raw = self._raw(obs[1:], batch).float()
        ended = batch["terminated"][STEPS] | batch["truncated"][STEPS]
        raw = raw.masked_fill(ended, 0.0)
        normalised = raw / self._scale(raw, ended)
        return raw, normalised if self.cfg.clip is None else normalised.clamp_max(self.cfg.clip)

    def _raw(self, next_obs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[T, B]`` raw rewards of the observations ``next_obs [T, B, *obs_shape]`` of ``batch``."""
        raise NotImplementedError

    def _scale(self, raw: torch.Tensor, ended: torch.Tensor) -> torch.Tensor:
        """The running std (a scalar tensor, at least 1e-8) that the ``[T, B]`` rewards ``raw`` are
        divided by, updated with this batch (``ended [T, B] bool``: the steps that end an episode).
        ``intrinsic.normalize=returns``: of the discounted intrinsic returns within each unroll, cut
        at an episode's end only if episodic (Burda et al. 2019, Section 2.4); ``rewards``: of the
        rewards of the steps that did not end an episode (E3B's ``reward_norm=int``)."""
        if self.cfg.normalize == "rewards":
            self.reward_rms.update_from(raw[~ended])
            return self.reward_rms.std.clamp_min(1e-8)
        keep = (~ended).float() if self.episodic else torch.ones_like(raw)
        returns = reverse_discounted_sum(raw, self.discount * keep)  # G_t = r_t + gamma keep_t G_{t+1}
        self.reward_rms.update_from(returns)
        return self.reward_rms.std.clamp_min(1e-8)

    def update(self, batch: dict[str, torch.Tensor]) -> float | None:
        """Train the module on the batch's observations (rows 1..T); its loss, or None (nothing to train)."""
        return None

    def checkpoint_state(self) -> dict[str, Any]:
        """Networks, running statistics and the optimizer's state."""
        return {"module": self.state_dict(), "optimizer": self.optimizer.state_dict() if self.optimizer else None}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["module"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
