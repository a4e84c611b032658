"""Intrinsic rewards for exploration, given to the learner's batches.

A module sees a ``[T+1, B]`` batch of rollouts (:mod:`distrl.rollout`) and gives every step ``t``
of rows ``0..T-1`` an intrinsic reward for the observation it led to (row ``t+1``), divided by a
running standard deviation ``sigma`` (below). By default the learner gives it a return and a value
head of its own and adds the advantages,
``A_t = A_ext_t + coef_t * A_int_t`` (:meth:`distrl.learning.losses.base.AgentLoss.unroll_targets`); with
``intrinsic.episodic=true`` it adds the rewards instead, ``r_t = clip(r_ext_t) + coef_t * r_int_t /
sigma``, in one return. ``coef_t`` is ``intrinsic.coef`` times its schedule
(:class:`distrl.learning.schedule.Schedule`).

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
  clip is 0.5), the value head's error drowning the policy's gradient (docs/lab/exploration.md).
- **The intrinsic head's loss in the units of its advantages**: its values and targets enter the
  value loss times ``coef_t`` (:meth:`distrl.learning.losses.base.AgentLoss.unroll_targets`), so the head
  weighs in the torso it shares with the policy as much as its advantages weigh in the policy
  gradient. Burda et al. train both heads at full weight beside standardised advantages; with raw
  advantages (``experiment=minigrid``) the unweighted head took the gradient even at coef 0.001
  (docs/lab/exploration.md).
- **E3B: the std of the bonuses, then a clip** (``intrinsic.normalize=rewards``, ``intrinsic.clip``),
  as E3B's code (facebookresearch/e3b: ``reward_norm=int``, rewards clipped to [-1, 1]); the two
  public implementations are compared with distrl's step by step in :mod:`distrl.intrinsic.e3b`.
  An episode's first bonuses are about ``|phi|^2 / ridge``, hundreds of times the later ones:
  divided by the std of the returns they set, the later bonuses were a few thousandths
  (docs/lab/exploration.md). They set the std of the bonuses too, in E3B's code as here: on
  DoorKey-16x16 an episode's first 10 paid steps hold 99.9 % of its squared bonus, and the later
  ones are about 0.001 of the std (``scripts/e3b_bonuses.py``; the same with the ReLU-ended
  embedding the references use, docs/lab/exploration.md). What E3B's code pays differs from
  distrl's defaults in the weight: its arithmetic is ``intrinsic.coef=0.3 intrinsic.clip=3.3``.
  And the std follows ``|phi|^2``, which grows as the embedding trains (an episode's first bonus
  309 at 0.75M, 4,938 at 3.04M on DoorKey-16x16): ``intrinsic.unit_embedding=true`` takes the bonus
  of ``phi / |phi|`` instead, at most ``1 / ridge`` (docs/lab/exploration.md).
  ``intrinsic.normalize`` and ``intrinsic.clip`` apply to every module.
- **RND's observation statistics** (Burda et al. 2019, Section 2.4): observations are standardised
  by a running mean and std per element and clipped to [-5, 5]; for Atari only the newest frame of
  the stack is used, as in the paper. The statistics start with the first batch (the paper first
  runs a random agent for a while).
- **One discount**, ``agent.discount``, for both returns (Burda et al. use 0.999 for the extrinsic
  and 0.99 for the intrinsic one; distrl's Atari default is 0.99 for the extrinsic return already).

Modules: :class:`RND` (Burda et al. 2019, "Exploration by Random Network Distillation") and
:class:`RE3` (Seo et al. 2021, "State Entropy Maximization with Random Encoders") compute their
rewards in the learner, from the batch's observations; :class:`E3B` (Henaff et al. 2022,
"Exploration via Elliptical Episodic Bonuses") in the actors, as each observation arrives (its
bonus depends on the whole episode so far), the learner training its embedding. Each has a
convolutional encoder for ``[C, H, W] uint8`` images and an MLP for flat ``float32`` vectors.
Their networks, optimizer and running statistics are all in :meth:`IntrinsicReward.state_dict`,
so a checkpoint resumes them exactly (E3B's per-episode matrices in the actors restart with the
episodes).
"""

from __future__ import annotations

from omegaconf import DictConfig

from distrl.intrinsic.base import NORMALIZATIONS, IntrinsicReward, feature_net
from distrl.intrinsic.e3b import E3B, ActorBonus
from distrl.intrinsic.re3 import RE3
from distrl.intrinsic.rnd import RND

__all__ = ["E3B", "NAMES", "NORMALIZATIONS", "RE3", "RND", "ActorBonus", "IntrinsicReward",
           "feature_net", "intrinsic_for_run", "make_intrinsic", "needs_value_head"]

NAMES = ("none", "rnd", "re3", "e3b")


def needs_value_head(cfg: DictConfig) -> bool:
    """Whether the ``intrinsic`` config node ``cfg`` asks for a second value head (a non-episodic
    intrinsic return; checkpoints written before ``intrinsic.episodic`` existed had none)."""
    return cfg.name != "none" and not cfg.get("episodic", True)


def make_intrinsic(obs_shape: tuple[int, ...], cfg: DictConfig, newest_frame_only: bool = False,
                   discount: float = 0.99, num_envs: int = 1, num_actions: int = 1,
                   model: DictConfig | None = None) -> IntrinsicReward | None:
    """The module ``cfg.name`` names (``none``: None), for batches of ``num_envs`` environments'
    slots (``env_id`` in ``0..num_envs-1``; the learner's actors' envs) in an env of ``num_actions``
    discrete actions; ``model``, the run's model node, for E3B's ``intrinsic.encoder=model``.

    Raises:
        ValueError: an unknown name, or observations no encoder fits.
    """
    if cfg.name == "none":
        return None
    if cfg.name == "rnd":
        return RND(obs_shape, cfg, newest_frame_only, discount, cfg.episodic)
    if cfg.name == "re3":
        return RE3(obs_shape, cfg, newest_frame_only, discount, cfg.episodic, num_envs)
    if cfg.name == "e3b":
        return E3B(obs_shape, cfg, num_actions, newest_frame_only, discount, cfg.episodic, model)
    raise ValueError(f"intrinsic={cfg.name!r}: use one of {', '.join(NAMES)}")


def intrinsic_for_run(cfg: DictConfig, spec, num_envs: int) -> IntrinsicReward | None:
    """:func:`make_intrinsic` for train config ``cfg`` on env ``spec`` (a :class:`distrl.envs.EnvSpec`)
    with ``num_envs`` envs stepping: Atari's newest frame only, the agent's discount."""
    return make_intrinsic(spec.obs_shape, cfg.intrinsic, newest_frame_only=cfg.env.kind == "atari",
                          discount=cfg.agent.discount, num_envs=num_envs, num_actions=spec.action_space.head_size,
                          model=cfg.model)
