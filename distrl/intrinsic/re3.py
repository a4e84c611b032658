"""RE3 (Seo et al. 2021): the distance to the k-th nearest neighbour in a random encoder's space."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from distrl.intrinsic.base import IntrinsicReward, feature_net, orthogonal_init


class RE3(IntrinsicReward):
    """Random Encoders for Efficient Exploration (Seo et al. 2021, Eq. 6).

    A fixed random encoder ``y = f(x)``; the reward of an observation is
    ``log(1 + ||y - y_kNN||_2)``, its distance to its ``intrinsic.k``-th nearest neighbour: a
    particle estimate of the state entropy, high where few recent observations lie. Seo et al. take
    the neighbours from the agent's buffer of recent transitions; here they are the batch's other
    ``T x B`` observations and the ``intrinsic.memory`` observations of the batches before it (one
    batch of 64 alone is too few: nearly every observation has fewer than k others like it).
    Nothing is trained.
    """

    def __init__(self, obs_shape: tuple[int, ...], cfg: DictConfig, newest_frame_only: bool = False,
                 discount: float = 0.99, episodic: bool = False):
        super().__init__(obs_shape, cfg, newest_frame_only, discount, episodic)
        self.encoder = feature_net(self.input_shape, cfg.embed_dim)
        orthogonal_init(self)
        self.encoder.requires_grad_(False)
        self.register_buffer("memory", torch.zeros(cfg.memory, cfg.embed_dim))
        self.register_buffer("filled", torch.zeros((), dtype=torch.int64))  # rows of memory in use
        self.register_buffer("next_row", torch.zeros((), dtype=torch.int64))

    def _raw(self, next_obs: torch.Tensor) -> torch.Tensor:
        y = self.encoder(self.inputs(next_obs))
        neighbours = torch.cat([y, self.memory[: int(self.filled)]])
        # [N, N + filled]; each sample's own distance (0) is its nearest; exact differences, not the matmul form
        distances = torch.cdist(y, neighbours, compute_mode="donot_use_mm_for_euclid_dist")
        k = min(self.cfg.k, neighbours.shape[0] - 1)
        kth = distances.kthvalue(k + 1, dim=1).values
        self._remember(y)
        return torch.log1p(kth)

    def _remember(self, y: torch.Tensor) -> None:
        """Put ``y`` into the memory, the oldest rows first out."""
        size = self.memory.shape[0]
        y = y[-size:]
        rows = (int(self.next_row) + torch.arange(y.shape[0], device=y.device)) % size
        self.memory[rows] = y
        self.next_row.fill_((int(self.next_row) + y.shape[0]) % size)
        self.filled.fill_(min(size, int(self.filled) + y.shape[0]))
