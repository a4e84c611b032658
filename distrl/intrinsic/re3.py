"""RE3 (Seo et al. 2021): the distance to the k-th nearest neighbour in a random encoder's space."""

from __future__ import annotations

import logging

import torch
from omegaconf import DictConfig

from distrl.intrinsic.base import IntrinsicReward, feature_net, orthogonal_init

log = logging.getLogger(__name__)


class RE3(IntrinsicReward):
    """Random Encoders for Efficient Exploration (Seo et al. 2021, Eq. 6).

    A fixed random encoder ``y = f(x)``; the reward of an observation is
    ``log(1 + ||y - y_kNN||_2)``, its distance to its ``intrinsic.k``-th nearest neighbour: a
    particle estimate of the state entropy, high where few recent observations lie. Seo et al. take
    the neighbours from the agent's buffer of recent transitions; here, as in rllte's RE3, they are
    the last ``intrinsic.memory`` observations of the same environment (the unroll's own ``T``
    included), so that an observation is novel for what its own env has seen lately, not for what
    any of the others has. Nothing is trained. With ``intrinsic.obs_norm`` the encoder's inputs are
    standardised per element by running statistics first, as rllte's RE3 does (``obs_norm_type="rms"``):
    MiniGrid's object, colour and state indices then weigh alike.

    Args:
        num_envs: the environments whose slots the batches hold (``env_id`` in ``0..num_envs-1``);
            the others as :class:`IntrinsicReward`'s.

    Buffers: ``memory [num_envs, intrinsic.memory, embed_dim]``, ``filled`` and ``next_row``
    ``[num_envs] int64`` (each env's rows in use, and where its next one goes).
    """

    def __init__(self, obs_shape: tuple[int, ...], cfg: DictConfig, newest_frame_only: bool = False,
                 discount: float = 0.99, episodic: bool = False, num_envs: int = 1):
        super().__init__(obs_shape, cfg, newest_frame_only, discount, episodic)
        self.encoder = feature_net(self.input_shape, cfg.embed_dim)
        orthogonal_init(self)
        self.encoder.requires_grad_(False)
        self.register_buffer("memory", torch.zeros(num_envs, cfg.memory, cfg.embed_dim))
        self.register_buffer("filled", torch.zeros(num_envs, dtype=torch.int64))
        self.register_buffer("next_row", torch.zeros(num_envs, dtype=torch.int64))

    def _raw(self, next_obs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        steps, envs = next_obs.shape[:2]
        inputs = self.inputs(next_obs.reshape(steps * envs, *next_obs.shape[2:]), update_stats=True)
        y = self.encoder(inputs).view(steps, envs, -1)
        raw = torch.empty(steps, envs, device=y.device)
        for b, env in enumerate(batch["env_id"].tolist()):  # in the batch's order: a later unroll of
            seen = self.memory[env, : int(self.filled[env])]  # the same env has the earlier one in memory
            neighbours = torch.cat([y[:, b], seen])
            # [T, T + filled]; each sample's own distance (0) is its nearest; exact differences, not the matmul form
            distances = torch.cdist(y[:, b], neighbours, compute_mode="donot_use_mm_for_euclid_dist")
            k = min(self.cfg.k, neighbours.shape[0] - 1)
            raw[:, b] = torch.log1p(distances.kthvalue(k + 1, dim=1).values)
            self._remember(env, y[:, b])
        return raw

    def _remember(self, env: int, y: torch.Tensor) -> None:
        """Put ``y [n, embed_dim]`` into env ``env``'s memory, its oldest rows first out."""
        size = self.memory.shape[1]
        y = y[-size:]
        at = int(self.next_row[env])
        rows = (at + torch.arange(y.shape[0], device=y.device)) % size
        self.memory[env, rows] = y
        self.next_row[env] = (at + y.shape[0]) % size
        self.filled[env] = min(size, int(self.filled[env]) + y.shape[0])

    def load_checkpoint_state(self, state: dict) -> None:
        """As :class:`IntrinsicReward`'s; a memory of another shape (a checkpoint of a run with other
        env counts, or of the single memory all envs shared before) starts empty instead."""
        module = dict(state["module"])
        if module["memory"].shape != self.memory.shape:
            log.warning("RE3's memory in the checkpoint is %s, this run's %s: it starts empty",
                        tuple(module["memory"].shape), tuple(self.memory.shape))
            for key in ("memory", "filled", "next_row"):
                module[key] = getattr(self, key)
        super().load_checkpoint_state({**state, "module": module})
