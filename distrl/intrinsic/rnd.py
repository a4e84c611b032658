"""RND (Burda et al. 2019): the error of a predictor trained to match a fixed random network."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from distrl.intrinsic.base import IntrinsicReward, feature_net, orthogonal_init


class RND(IntrinsicReward):
    """Random Network Distillation (Burda et al. 2019, Eq. 1 and Section 2.4).

    A fixed random target network ``f`` and a predictor ``f_hat`` trained to match it on the
    observations seen; the reward of an observation is the prediction error
    ``||f_hat(x) - f(x)||^2`` (here averaged over the ``intrinsic.embed_dim`` features), high for
    observations unlike those seen before. ``x`` is standardised and clipped to [-5, 5]
    (``intrinsic.obs_norm``, true in conf/intrinsic/rnd.yaml). The
    predictor has two more layers than the target (the paper's Appendix A.4) and is trained with
    Adam at ``intrinsic.lr`` on every observation of every batch.
    """

    def __init__(self, obs_shape: tuple[int, ...], cfg: DictConfig, newest_frame_only: bool = False,
                 discount: float = 0.99, episodic: bool = False):
        super().__init__(obs_shape, cfg, newest_frame_only, discount, episodic)
        self.target = feature_net(self.input_shape, cfg.embed_dim)
        self.predictor = nn.Sequential(feature_net(self.input_shape, cfg.embed_dim), nn.ReLU(),
                                       nn.Linear(cfg.embed_dim, cfg.embed_dim), nn.ReLU(),
                                       nn.Linear(cfg.embed_dim, cfg.embed_dim))
        orthogonal_init(self)
        self.target.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.predictor.parameters(), lr=cfg.lr)

    def _raw(self, next_obs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        steps, envs = next_obs.shape[:2]
        next_obs = next_obs.reshape(steps * envs, *next_obs.shape[2:])
        x = self.inputs(next_obs, update_stats=True)
        target = self.target(x)
        # update() trains on the same observations next: keep what it would compute again
        self._seen = (next_obs.data_ptr(), next_obs.shape[0], x, target)
        return (self.predictor(x) - target).pow(2).mean(-1).view(steps, envs)

    def update(self, batch: dict[str, torch.Tensor]) -> float:
        obs = batch["obs"][1:]
        obs = obs.reshape(-1, *obs.shape[2:])
        seen = getattr(self, "_seen", None)
        if seen is not None and seen[:2] == (obs.data_ptr(), obs.shape[0]):  # rewards() of this batch ran
            x, target = seen[2:]
        else:
            with torch.no_grad():
                x = self.inputs(obs)
                target = self.target(x)
        self._seen = None
        loss = F.mse_loss(self.predictor(x), target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.item()
