"""Intrinsic rewards for exploration, computed by the learner on the batch it trains on.

The actors are not involved: a module sees a ``[T+1, B]`` batch of rollouts (:mod:`distrl.rollout`)
and gives every step ``t`` of rows ``0..T-1`` an intrinsic reward for the observation it led to
(row ``t+1``), divided by a running standard deviation ``sigma`` (below). By default the learner
gives it a return and a value head of its own and adds the advantages,
``A_t = A_ext_t + coef_t * A_int_t`` (:meth:`distrl.agents.base.AgentLoss.targets`); with
``intrinsic.episodic=true`` it adds the rewards instead, ``r_t = clip(r_ext_t) + coef_t * r_int_t /
sigma``, in one return. ``coef_t`` is ``intrinsic.coef`` times its schedule
(:class:`distrl.engine.schedule.Schedule`).

Decisions, with their sources:

- **Non-episodic, two value heads** (Burda et al. 2019, Section 2.3; ``intrinsic.episodic=false``,
  the default). The intrinsic return runs on across episode ends: reaching a goal does not cost
  the novelty still to come, so the agent is not paid to keep an episode going. It has its own
  value head and its own V-trace targets (same importance weights, no discount cut at an episode's
  end); the policy gradient's advantage is ``A_ext + coef_t * A_int`` (Burda et al. weight the two
  streams' advantages the same way, 2 and 1). With ``intrinsic.episodic=true`` the intrinsic reward
  joins the extrinsic one in one reward and one value head instead, and an episode's end cuts both.
  Either way, a step that ends an episode gets no intrinsic reward: its next observation (the
  final one) is not stored; row ``t+1`` there is the next episode's first.
- **Normalisation by the running std of the intrinsic returns, no mean subtracted** (Burda et
  al. 2019, Section 2.4), for both modules: the intrinsic value head then learns targets of about
  unit scale. The learner does not see an env's unrolls in order, so the returns are those within
  each unroll of T steps (Burda et al. run a forward filter over the whole stream). Seo et al.
  (2021) do not normalise RE3 (their ``beta`` was tuned per task); rllte standardises the rewards
  (mean subtracted) and clips them to [-1, 1]. Dividing RE3 by the std of its rewards, as distrl did
  first, left the intrinsic value loss at 3-17 and the gradient norm at 20-180 on DoorKey-8x8 (the
  clip is 0.5), the value head's error drowning the policy's gradient (docs/exploration.md).
- **RND's observation statistics** (Burda et al. 2019, Section 2.4): observations are standardised
  by a running mean and std per element and clipped to [-5, 5]; for Atari only the newest frame of
  the stack is used, as in the paper. The statistics start with the first batch (the paper first
  runs a random agent for a while).
- **One discount**, ``agent.discount``, for both returns (Burda et al. use 0.999 for the extrinsic
  and 0.99 for the intrinsic one; distrl's Atari default is 0.99 for the extrinsic return already).

Modules: :class:`RND` (Burda et al. 2019, "Exploration by Random Network Distillation") and
:class:`RE3` (Seo et al. 2021, "State Entropy Maximization with Random Encoders"). Each has a
convolutional encoder for ``[C, H, W] uint8`` images and an MLP for flat ``float32`` vectors.
Their networks, optimizer and running statistics are all in :meth:`IntrinsicReward.state_dict`,
so a checkpoint resumes them exactly.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from distrl.rollout import STEPS

NAMES = ("none", "rnd", "re3")


def needs_value_head(cfg: DictConfig) -> bool:
    """Whether the ``intrinsic`` config node ``cfg`` asks for a second value head (a non-episodic
    intrinsic return; checkpoints written before ``intrinsic.episodic`` existed had none)."""
    return cfg.name != "none" and not cfg.get("episodic", True)


class RunningMeanStd(nn.Module):
    """Running mean and variance of ``[N, *shape]`` samples (Chan et al. 1979's parallel update),
    kept as buffers so that they are in the module's ``state_dict``."""

    def __init__(self, shape: tuple[int, ...] = ()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.detach().double().reshape(-1, *self.mean.shape)
        n = x.shape[0]
        if n == 0:
            return
        mean, var = x.mean(0), x.var(0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.var.copy_((self.var * self.count + var * n + delta**2 * self.count * n / total) / total)
        self.count.copy_(total)

    @property
    def std(self) -> torch.Tensor:
        return self.var.sqrt().float()


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


def _orthogonal(module: nn.Module) -> None:
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
    """

    def __init__(self, obs_shape: tuple[int, ...], cfg: DictConfig, newest_frame_only: bool = False,
                 discount: float = 0.99, episodic: bool = False):
        super().__init__()
        self.is_image = len(obs_shape) == 3
        self.newest_frame_only = newest_frame_only and self.is_image
        self.input_shape = (1, *obs_shape[1:]) if self.newest_frame_only else tuple(obs_shape)
        self.discount = discount
        self.episodic = episodic
        self.cfg = cfg
        self.reward_rms = RunningMeanStd()
        self.optimizer: torch.optim.Optimizer | None = None

    def inputs(self, obs: torch.Tensor) -> torch.Tensor:
        """``[N, *obs_shape]`` observations as the encoder's float inputs."""
        if self.newest_frame_only:
            obs = obs[:, -1:]
        return obs.float().div(255.0) if self.is_image else obs.float()

    @torch.no_grad()
    def rewards(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The intrinsic rewards of a ``[T+1, B]`` batch's ``T`` steps: ``(raw, normalised)``, each
        ``[T, B] float32``; 0 where a step ends its episode. Updates the running statistics."""
        obs = batch["obs"]
        T1, B = obs.shape[:2]
        raw = self._raw(obs[1:].reshape((T1 - 1) * B, *obs.shape[2:])).view(T1 - 1, B).float()
        ended = batch["terminated"][STEPS] | batch["truncated"][STEPS]
        raw = raw.masked_fill(ended, 0.0)
        return raw, raw / self._scale(raw, ended)

    def _raw(self, next_obs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _scale(self, raw: torch.Tensor, ended: torch.Tensor) -> torch.Tensor:
        """The running std of the discounted intrinsic returns within each unroll (cut at an
        episode's end only if episodic), which the rewards are divided by."""
        returns = torch.zeros_like(raw)
        running = torch.zeros_like(raw[0])
        keep = (~ended).float() if self.episodic else torch.ones_like(raw)
        for t in range(raw.shape[0] - 1, -1, -1):
            running = raw[t] + self.discount * running * keep[t]
            returns[t] = running
        self.reward_rms.update(returns)
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


class RND(IntrinsicReward):
    """Random Network Distillation (Burda et al. 2019, Eq. 1 and Section 2.4).

    A fixed random target network ``f`` and a predictor ``f_hat`` trained to match it on the
    observations seen; the reward of an observation is the prediction error
    ``||f_hat(x) - f(x)||^2`` (here averaged over the ``intrinsic.embed_dim`` features), high for
    observations unlike those seen before. ``x`` is standardised and clipped to [-5, 5]. The
    predictor has two more layers than the target (the paper's Appendix A.4) and is trained with
    Adam at ``intrinsic.lr`` on every observation of every batch.
    """

    def __init__(self, obs_shape: tuple[int, ...], cfg: DictConfig, newest_frame_only: bool = False,
                 discount: float = 0.99, episodic: bool = False):
        super().__init__(obs_shape, cfg, newest_frame_only, discount, episodic)
        self.obs_rms = RunningMeanStd(self.input_shape)
        self.target = feature_net(self.input_shape, cfg.embed_dim)
        self.predictor = nn.Sequential(feature_net(self.input_shape, cfg.embed_dim), nn.ReLU(),
                                       nn.Linear(cfg.embed_dim, cfg.embed_dim), nn.ReLU(),
                                       nn.Linear(cfg.embed_dim, cfg.embed_dim))
        _orthogonal(self)
        self.target.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.predictor.parameters(), lr=cfg.lr)

    def _standardised(self, inputs: torch.Tensor) -> torch.Tensor:
        """Encoder inputs standardised by the running statistics and clipped to [-5, 5] (Section 2.4)."""
        return ((inputs - self.obs_rms.mean.float()) / self.obs_rms.std.clamp_min(1e-8)).clamp(-5.0, 5.0)

    def _raw(self, next_obs: torch.Tensor) -> torch.Tensor:
        inputs = self.inputs(next_obs)
        self.obs_rms.update(inputs)
        x = self._standardised(inputs)
        target = self.target(x)
        # update() trains on the same observations next: keep what it would compute again
        self._seen = (next_obs.data_ptr(), next_obs.shape[0], x, target)
        return (self.predictor(x) - target).pow(2).mean(-1)

    def update(self, batch: dict[str, torch.Tensor]) -> float:
        obs = batch["obs"][1:]
        obs = obs.reshape(-1, *obs.shape[2:])
        seen = getattr(self, "_seen", None)
        if seen is not None and seen[:2] == (obs.data_ptr(), obs.shape[0]):  # rewards() of this batch ran
            x, target = seen[2:]
        else:
            with torch.no_grad():
                x = self._standardised(self.inputs(obs))
                target = self.target(x)
        self._seen = None
        loss = F.mse_loss(self.predictor(x), target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.item()


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
        _orthogonal(self)
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


def make_intrinsic(obs_shape: tuple[int, ...], cfg: DictConfig, newest_frame_only: bool = False,
                   discount: float = 0.99) -> IntrinsicReward | None:
    """The module ``cfg.name`` names (``none``: None).

    Raises:
        ValueError: an unknown name, or observations no encoder fits.
    """
    if cfg.name == "none":
        return None
    if cfg.name == "rnd":
        return RND(obs_shape, cfg, newest_frame_only, discount, cfg.episodic)
    if cfg.name == "re3":
        return RE3(obs_shape, cfg, newest_frame_only, discount, cfg.episodic)
    raise ValueError(f"intrinsic={cfg.name!r}: use one of {', '.join(NAMES)}")
