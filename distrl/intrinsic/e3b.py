"""E3B (Henaff et al. 2022, "Exploration via Elliptical Episodic Bonuses"): the bonus computed in the
actors, the embedding trained by the learner.

The bonus of an observation ``x`` with embedding ``phi(x)`` (a ``[D]`` vector) is
``b = phi(x)^T C^-1 phi(x)`` (the paper's Eq. 2), where ``C = ridge I + sum phi(x_i) phi(x_i)^T`` over
the observations of the episode so far: large for an embedding unlike those the episode has seen.
Every env of an actor keeps its own ``C^-1``, ``I / ridge`` at each episode's first observation,
updated by the Sherman-Morrison rank-one formula after each observation (Eq. 3),
``C^-1 <- C^-1 - u u^T / (1 + b)`` with ``u = C^-1 phi(x)``: ``D^2`` operations a step, no inverse.
The actor stores ``b`` at the observation's row (``intrinsic_bonus``, :mod:`distrl.rollout`), and
step ``t``'s intrinsic reward is that of the observation it led to (row ``t+1``), as for the other
modules.

The embedding ``phi`` is trained in the learner by inverse dynamics (the paper's Section 3.2: from
``phi(x_t)`` and ``phi(x_{t+1})``, predict ``a_t``, cross-entropy), and published to the actors'
copy in shared memory after each update, as the policy's weights are: the actors' ``phi`` is as
stale as their policy. This follows E3B's own IMPALA code (facebookresearch/e3b, ``act()``), which
keeps ``C^-1`` per actor and resets it at each episode's end.

Against the two public implementations, step by step (E3B's IMPALA code, facebookresearch/e3b,
``minihack/torchbeast/src/``: ``utils.py`` ``act()``, ``algos/e3b.py`` ``learn()``, ``models.py``;
RLeXplore's, RLE-Foundation/rllte, ``rllte/xplore/reward/e3b.py`` and
``rllte/common/prototype/base_reward.py``):

- ``C`` starts at ``ridge I`` (``C^-1 = I / ridge``, ridge 0.1) and restarts with each episode in all
  three; the bonus is taken before ``C`` counts the observation (``b = phi^T C^-1 phi``, then
  Sherman-Morrison) in all three.
- Which step is paid: E3B's code pays the action taken from ``x_t`` the bonus of ``x_t`` and sets an
  episode's first bonus to 0 (``x_0`` counted in ``C``, not paid); distrl pays the action that led
  to ``x_{t+1}`` its bonus, and nothing to a step that ends an episode (its ``x_{t+1}`` is the next
  episode's first): the same bonuses per episode, each one step earlier. RLeXplore pays ``x_t``'s
  bonus to the action from it, ``x_0``'s included (``|phi|^2 / ridge``, an episode's largest).
- The embedding ends in a ReLU in both (E3B's ``NetHackStateEmbeddingNet``: ``fc2`` Linear + ReLU,
  1,024 features; RLeXplore's image ``ObservationEncoder``: Linear + ReLU, 128), so here too
  (:func:`embedding_net`, ``intrinsic.embed_dim`` features, 128). RLeXplore's MiniGrid runs (its
  ``reward`` branch) embed with ``MinigridEncoder``, three 2x2 convolutions on the cell indices and
  a Linear + ReLU of 512: ``intrinsic.encoder=model`` with ``model.encoder=minigrid_cnn`` takes those
  layers (distrl's has a max-pool after the first convolution).
- Its training: one Adam step per batch at lr 1e-4 (E3B's; its gradient norm clipped at 40), here
  without the clip; RLeXplore takes one pass over each batch in shuffled minibatches of 256 steps at
  lr 1e-3 (``intrinsic.minibatch_size=256 intrinsic.lr=0.001``). Both train on every step, the one
  across an episode's end too (its next row is the next episode's first); distrl leaves those out.
- The bonus's scale: E3B's code divides by a running std of the bonuses (``reward_norm=int``),
  weighs it 1 and clips the total reward to [-1, 1]. Its running count grows by T per batch where
  its sums grow by T x B bonuses (``update_running_moments``), so its std is ``k`` times the
  bonuses' ``sigma``, ``k`` at least ``sqrt(B)`` (B = 8 by default: 2.8; 3.4-4.2 on simulated
  streams of bonuses, docs/lab/exploration.md), and a step without extrinsic reward is paid
  ``min(b / (k sigma), 1) = (1 / k) min(b / sigma, k)``. RLeXplore divides by the running std and
  weighs it 1, no clip. Here: ``intrinsic.coef * min(b / sigma, intrinsic.clip)``, ``sigma`` the
  running std of the bonuses paid (:meth:`distrl.intrinsic.base.IntrinsicReward.rewards`):
  ``intrinsic.coef=0.3 intrinsic.clip=3.3`` is E3B's arithmetic (``k = 3.3``).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn

from distrl.intrinsic.base import IntrinsicReward, encoder_inputs, feature_net, orthogonal_init
from distrl.nn.encoders import make_encoder
from distrl.rollout import STEPS


def embedding_net(input_shape: tuple[int, ...], embed_dim: int) -> nn.Sequential:
    """E3B's ``phi``: :func:`distrl.intrinsic.base.feature_net`'s layers to ``[N, embed_dim]``, then a
    ReLU, as both references end theirs (the module's docstring), so every embedding is ``>= 0``.
    The ReLU holds no weights: a checkpoint from before it loads."""
    net = feature_net(input_shape, embed_dim)
    net.append(nn.ReLU())
    return net


class EllipticalBonus:
    """One actor's side of E3B: the bonus of each observation its envs see, each env with its own
    ``C^-1``.

    Args:
        encoder: the actors' copy of the embedding ``phi`` (shared memory, published by the learner).
        dim: ``phi``'s features ``D``.
        num_envs: the actor's environments.
        ridge: ``C``'s initial diagonal (``intrinsic.ridge``).
        unit: take the bonus of ``phi / |phi|`` (``intrinsic.unit_embedding``): each bonus is then at
            most ``1 / ridge`` whatever ``phi``'s scale (Abbasi-Yadkori et al. 2011, Lemma 11, bound
            the elliptical potential for ``|phi| <= L``, ``ridge >= L^2``).
        is_image, newest_frame_only: how observations become ``phi``'s inputs
            (:func:`distrl.intrinsic.base.encoder_inputs`).

    Attributes:
        cov_inverse: ``[num_envs, D, D] float32``, each env's ``C^-1``.
    """

    def __init__(self, encoder: nn.Module, dim: int, num_envs: int, ridge: float, is_image: bool,
                 newest_frame_only: bool, unit: bool = False):
        self.encoder = encoder
        self.ridge, self.unit = ridge, unit
        self.is_image, self.newest_frame_only = is_image, newest_frame_only
        self.identity = torch.eye(dim) / ridge
        self.cov_inverse = self.identity.repeat(num_envs, 1, 1)

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor, first: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The bonuses ``[k] float32`` of observations ``obs [k, *obs_shape]`` of envs ``ids [k] int64``
        (``first [k] bool``: an episode's first observation, which restarts the env's ``C^-1``);
        each env's ``C^-1`` then counts its observation."""
        if bool(first.any()):
            self.cov_inverse[ids[first]] = self.identity
        phi = self.encoder(encoder_inputs(obs, self.is_image, self.newest_frame_only)).float()  # [k, D]
        if self.unit:
            phi = F.normalize(phi, dim=-1)
        consecutive = bool((ids[1:] - ids[:-1] == 1).all())
        # consecutive envs (the usual case): a view, updated in place; else a gathered copy, written back
        at = slice(int(ids[0]), int(ids[-1]) + 1) if consecutive else ids
        cov_inverse = self.cov_inverse[at]  # [k, D, D]
        u = torch.bmm(cov_inverse, phi.unsqueeze(-1)).squeeze(-1)
        bonus = (phi * u).sum(-1)
        v = (u / (1.0 + bonus).sqrt().unsqueeze(-1)).unsqueeze(-1)  # C^-1 -= u u^T / (1 + b) = v v^T
        cov_inverse.baddbmm_(v, v.transpose(1, 2), alpha=-1.0)
        if not consecutive:
            self.cov_inverse[at] = cov_inverse
        return bonus


class ActorBonus:
    """What an actor process needs to compute E3B's bonus (picklable: the encoder is in shared memory).

    :meth:`start` gives an actor its :class:`EllipticalBonus`."""

    def __init__(self, encoder: nn.Module, dim: int, ridge: float, is_image: bool, newest_frame_only: bool,
                 unit: bool = False):
        self.encoder, self.dim, self.ridge, self.unit = encoder, dim, ridge, unit
        self.is_image, self.newest_frame_only = is_image, newest_frame_only

    def start(self, num_envs: int) -> EllipticalBonus:
        return EllipticalBonus(self.encoder, self.dim, num_envs, self.ridge, self.is_image, self.newest_frame_only,
                               self.unit)


class E3B(IntrinsicReward):
    """E3B's learner side: the rewards are the bonuses the actors stored; :meth:`update` trains the
    embedding by inverse dynamics (Adam at ``intrinsic.lr`` on every step of every batch that did not
    end an episode: one step on the whole batch, or with ``intrinsic.minibatch_size`` one pass in
    shuffled minibatches of that many steps) and publishes it to the actors' copy (:attr:`actor_bonus`).

    Args:
        num_actions: the env's discrete actions (the inverse dynamics' outputs); the others as
            :class:`IntrinsicReward`'s.
        model: the run's model node: with ``intrinsic.encoder=model``, ``phi`` has ``model.encoder``'s
            layers (:func:`distrl.nn.encoders.make_encoder`, ``embed_dim`` features, weights of its own)
            and takes the observations as that encoder does (all of an image's channels, unscaled:
            the encoder scales them itself).

    Raises:
        ValueError: ``intrinsic.encoder=model`` without ``model``, or observations its encoder does not take.

    Attributes:
        encoder: ``phi``, observations to ``[N, intrinsic.embed_dim]``, ``>= 0`` (:func:`embedding_net`;
            with ``intrinsic.encoder=model``, ending as that encoder does: a ReLU for the image ones).
        inverse_dynamics: ``[N, 2 embed_dim] -> [N, num_actions]`` logits, one hidden layer of 256.
        actor_bonus: the actors' part (:class:`ActorBonus`), with ``phi``'s copy in shared memory on
            the CPU; not in :meth:`state_dict` (it is the learner's ``phi``, published).
    """

    def __init__(self, obs_shape: tuple[int, ...], cfg: DictConfig, num_actions: int, newest_frame_only: bool = False,
                 discount: float = 0.99, episodic: bool = True, model: DictConfig | None = None):
        of_model = cfg.get("encoder", "own") == "model"  # runs from before the key: own
        super().__init__(obs_shape, cfg, newest_frame_only and not of_model, discount, episodic)
        if of_model:
            if model is None:
                raise ValueError("intrinsic.encoder=model needs the run's model node")
            layers = OmegaConf.merge(model, {"feature_dim": cfg.embed_dim, "layer_norm": False})
            self.encoder = make_encoder(tuple(obs_shape), layers)
            self.is_image = False  # the inputs as they are (encoder_inputs): the model's encoder scales its own
        else:
            self.encoder = embedding_net(self.input_shape, cfg.embed_dim)
        self.inverse_dynamics = nn.Sequential(nn.Linear(2 * cfg.embed_dim, 256), nn.ReLU(), nn.Linear(256, num_actions))
        orthogonal_init(self)
        self.optimizer = torch.optim.Adam(self.parameters(), lr=cfg.lr)
        actor_encoder = copy.deepcopy(self.encoder).requires_grad_(False).eval().share_memory()
        # not a Module: nn.Module does not register it, so it stays on the CPU and out of the state_dict
        self.actor_bonus = ActorBonus(actor_encoder, cfg.embed_dim, cfg.ridge, self.is_image, self.newest_frame_only,
                                      bool(cfg.get("unit_embedding", False)))  # runs from before the key: false

    def _raw(self, next_obs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch["intrinsic_bonus"][1:]

    def update(self, batch: dict[str, torch.Tensor]) -> float:
        """Adam steps of the embedding and the inverse dynamics on a ``[T+1, B]`` batch (``obs``,
        ``action [T+1, B] int64``, the episode ends), then :meth:`publish`: one step on the whole batch
        or, with ``intrinsic.minibatch_size`` n, one pass over its steps in a random order, a step per
        n. Returns the inverse dynamics' cross-entropy (nats, mean over the steps that did not end an
        episode, averaged over the minibatches; 0 if all did)."""
        obs = batch["obs"]
        steps, envs = obs.shape[0] - 1, obs.shape[1]
        within = ~(batch["terminated"][STEPS] | batch["truncated"][STEPS])  # row t+1 is the same episode's
        size = self.cfg.get("minibatch_size")  # runs from before the key: one step on the batch
        if size is not None:
            return self._minibatch_pass(obs[:-1][within], obs[1:][within], batch["action"][STEPS][within], size)
        phi = self.encoder(self.inputs(obs.reshape((steps + 1) * envs, *obs.shape[2:]))).view(steps + 1, envs, -1)
        logits = self.inverse_dynamics(torch.cat([phi[:-1], phi[1:]], dim=-1))  # [T, B, A]
        loss = F.cross_entropy(logits[within], batch["action"][STEPS][within]) if bool(within.any()) \
            else logits.sum() * 0.0
        self._step(loss)
        self.publish()
        return loss.item()

    def _minibatch_pass(self, obs: torch.Tensor, next_obs: torch.Tensor, action: torch.Tensor, size: int) -> float:
        """One pass over ``n`` transitions (``obs``, ``next_obs [n, *obs_shape]``, ``action [n]``) in a
        random order, one Adam step per ``size`` of them (RLeXplore's E3B.update); then :meth:`publish`."""
        losses = []
        for part in torch.randperm(obs.shape[0]).split(size):
            phi = self.encoder(self.inputs(torch.cat([obs[part], next_obs[part]])))
            logits = self.inverse_dynamics(torch.cat(phi.chunk(2), dim=-1))  # [size, A]
            loss = F.cross_entropy(logits, action[part])
            self._step(loss)
            losses.append(loss.item())
        self.publish()
        return sum(losses) / len(losses) if losses else 0.0

    def _step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    @torch.no_grad()
    def publish(self) -> None:
        """Copy the learner's ``phi`` into the actors' copy."""
        for actor_p, learner_p in zip(self.actor_bonus.encoder.parameters(), self.encoder.parameters(), strict=True):
            actor_p.copy_(learner_p)

    def load_checkpoint_state(self, state: dict) -> None:
        super().load_checkpoint_state(state)
        self.publish()
