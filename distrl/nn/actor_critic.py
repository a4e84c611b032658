"""The IMPALA network (:class:`ActorCritic`) and how it is stepped on envs.

Optionally a running normalisation of vector observations (:mod:`distrl.nn.normalization`); an
encoder (:mod:`distrl.nn.encoders`); optionally the previous action (one-hot, or a Box's action) and
reward (clipped to [-1, 1]) beside the encoder's features (IMPALA's Fig. 3 feeds them to its LSTM;
monobeast's AtariNet concatenates them with or without one); an optional LSTM core; a policy head
(the policy parameters of the action space's distribution, :mod:`distrl.nn.distributions`) and a
baseline head (state value), with a second one for the value of a non-episodic intrinsic return
when a run has one (Burda et al. 2019, Section 2.3; :mod:`distrl.intrinsic`). With
``model.separate_critic`` the baseline heads read an encoder of their own (CleanRL's continuous-control
agent: separate actor and critic MLPs).

This module knows nothing of envs or processes: :mod:`distrl.sampling.policy` steps the network on envs.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn

from distrl.nn.distributions import ActionSpace
from distrl.nn.encoders import init_weights, make_encoder
from distrl.nn.normalization import RunningMeanStd, value_statistics
from distrl.rollout import BEHAVIOUR_PREACTIVATIONS

CoreState = tuple[torch.Tensor, ...]


class ActorCritic(nn.Module):
    """Encoder -> (LSTM) -> policy parameters and baseline, over a ``[T, B]`` unroll.

    Args:
        obs_shape: one observation's shape.
        action_space: the :class:`ActionSpace` (an int ``A`` means ``Discrete(A)``).
        cfg: the ``model`` config node (``normalize_obs``, ``obs_clip``, ``separate_critic`` and
            ``log_std_init`` are optional: absent means false, 10, false and 0).
        intrinsic_value: add a second baseline head, ``intrinsic_baseline``, for the value of the
            intrinsic return (:func:`distrl.intrinsic.needs_value_head`).
        return_norm: keep the running statistics of the discounted return (``return_norm``,
            ``agent.normalize_rewards``): buffers of the network, so that they are saved and published
            with it; the learner updates and uses them.
        value_norm: keep the running statistics of the value targets (``value_norm``,
            ``agent.normalize_values``, :func:`distrl.nn.normalization.value_statistics`): the baseline
            head's outputs are then normalised values (the learner denormalises them for the return
            estimator and normalises the targets, :mod:`distrl.nn.normalization`).

    Raises:
        ValueError: ``model.separate_critic`` with an LSTM core.
    """

    def __init__(self, obs_shape: tuple[int, ...], action_space: ActionSpace | int, cfg: DictConfig,
                 intrinsic_value: bool = False, return_norm: bool = False, value_norm: bool = False):
        super().__init__()
        self.obs_shape = tuple(obs_shape)
        self.action_space = space = ActionSpace.of(action_space)
        self.obs_norm = (RunningMeanStd(self.obs_shape, clip=float(cfg.get("obs_clip", 10.0)))
                         if cfg.get("normalize_obs", False) else None)
        self.return_norm = RunningMeanStd(()) if return_norm else None
        self.value_norm = value_statistics() if value_norm else None
        self.encoder = make_encoder(self.obs_shape, cfg)
        # checkpoints written before model.last_action_reward existed have neither input
        self.last_action_reward = bool(cfg.get("last_action_reward", False))
        core_in = cfg.feature_dim + (space.encoding_size + 1 if self.last_action_reward else 0)
        self.core = nn.LSTM(core_in, cfg.feature_dim) if cfg.use_lstm else None
        self.critic_encoder = None
        if cfg.get("separate_critic", False):
            if self.core is not None:
                raise ValueError("model.separate_critic=true: not with model.use_lstm=true")
            self.critic_encoder = make_encoder(self.obs_shape, cfg)
        head_in = cfg.feature_dim if cfg.use_lstm else core_in
        self.policy = nn.Linear(head_in, space.head_size)
        self.log_std = (nn.Parameter(torch.full((space.dim,), float(cfg.get("log_std_init", 0.0))))
                        if space.kind == "box" else None)
        self.baseline = nn.Linear(head_in, 1)
        self.intrinsic_baseline = nn.Linear(head_in, 1) if intrinsic_value else None
        init_weights(self, cfg.init_fn)
        if cfg.init_fn == "orthogonal":
            nn.init.orthogonal_(self.policy.weight, gain=0.01)
            for head in (self.baseline, self.intrinsic_baseline):
                if head is not None:
                    nn.init.orthogonal_(head.weight, gain=1.0)
        if len(self.obs_shape) == 3:
            self.to(memory_format=torch.channels_last)

    @property
    def num_actions(self) -> int:
        """The policy head's width: the number of logits (the actions of a Discrete space)."""
        return self.action_space.head_size

    def initial_state(self, batch_size: int) -> CoreState:
        """Zero LSTM state ``(h, c)``, each ``[1, B, feature_dim]``; ``()`` without LSTM."""
        if self.core is None:
            return ()
        size = (1, batch_size, self.core.hidden_size)
        return tuple(torch.zeros(size, device=self.policy.weight.device) for _ in range(2))

    def forward(
        self, obs: torch.Tensor, first: torch.Tensor, core_state: CoreState = (),
        last_action: torch.Tensor | None = None, last_reward: torch.Tensor | None = None,
        with_preactivations: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, CoreState] | tuple[torch.Tensor, torch.Tensor, CoreState, torch.Tensor]:
        """Policy parameters and baseline over an unroll.

        Args:
            obs: ``[T, B, *obs_shape]`` (uint8 images or float32 vectors).
            first: ``[T, B] bool``, True where ``obs[t]`` starts a new episode; the
                LSTM state is zeroed before that step, and so are the previous action and reward.
            core_state: LSTM state at ``t = 0`` (``initial_state``), or ``()``.
            last_action: ``[T, B, *action_shape]``, the action taken before ``obs[t]`` (any value where
                ``first``); needed with ``model.last_action_reward``, else ignored.
            last_reward: ``[T, B] float32``, the raw reward that action gave; used clipped to [-1, 1].
            with_preactivations: also return the encoder's output features before their activation.

        Returns:
            ``params [T, B, P] float32`` (the policy parameters, :attr:`ActionSpace.param_size` wide:
            the logits, or a Gaussian's mean and log-std), ``baseline [T, B] float32`` (float32 under
            a bf16 :func:`autocast` too: the heads' outputs are cast back), the core state after step
            T-1. With the intrinsic head, ``baseline`` is ``[T, B, 2] float32``: the extrinsic value,
            then the intrinsic one. With ``with_preactivations``, fourth, ``[T, B, feature_dim]``: the
            (policy) encoder's last linear layer's output, in the autocast's dtype.

        Raises:
            ValueError: ``model.last_action_reward`` is on and ``last_action`` or ``last_reward`` is None.
        """
        T, B = obs.shape[:2]
        obs = obs.reshape(T * B, *self.obs_shape)
        if self.obs_norm is not None:
            obs = self.obs_norm.normalize(obs.float())
        if with_preactivations:
            encoded, preactivations = self.encoder.forward_with_preactivation(obs)
        else:
            encoded = self.encoder(obs)
        features = self._with_previous(encoded, first, last_action, last_reward)
        if self.core is not None:
            features = features.view(T, B, -1)
            outputs = []
            keep = (~first).float().unsqueeze(-1)  # [T, B, 1]
            for t in range(T):
                core_state = tuple(keep[t].unsqueeze(0) * s for s in core_state)
                out, core_state = self.core(features[t].unsqueeze(0), core_state)
                outputs.append(out)
            features = torch.cat(outputs).view(T * B, -1)
            core_state = tuple(s.float() for s in core_state)  # fp32 between steps under bf16 autocast too
        params = self.policy(features).view(T, B, -1).float()  # fp32 under bf16 autocast too
        if self.log_std is not None:
            params = torch.cat([params, self.log_std.float().expand_as(params)], dim=-1)
        if self.critic_encoder is not None:
            features = self._with_previous(self.critic_encoder(obs), first, last_action, last_reward)
        baseline = self.baseline(features).view(T, B).float()
        if self.intrinsic_baseline is not None:
            baseline = torch.stack([baseline, self.intrinsic_baseline(features).view(T, B).float()], dim=-1)
        if with_preactivations:
            return params, baseline, core_state, preactivations.view(T, B, -1)
        return params, baseline, core_state

    def _with_previous(self, features: torch.Tensor, first: torch.Tensor, last_action: torch.Tensor | None,
                       last_reward: torch.Tensor | None) -> torch.Tensor:
        """``features [T*B, F]`` with the previous action and reward beside them (``model.last_action_reward``)."""
        if not self.last_action_reward:
            return features
        if last_action is None or last_reward is None:
            raise ValueError("model.last_action_reward=true: forward needs last_action and last_reward")
        n = features.shape[0]
        seen = (~first).reshape(n, 1).to(features.dtype)  # nothing came before an episode's start
        action = self.action_space.encode(last_action.reshape(n, *self.action_space.action_shape), features.dtype)
        reward = last_reward.reshape(n, 1).to(features.dtype).clamp(-1.0, 1.0)
        return torch.cat([features, action * seen, reward * seen], dim=1)

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, first: torch.Tensor, core_state: CoreState = (), deterministic: bool = False,
        last_action: torch.Tensor | None = None, last_reward: torch.Tensor | None = None,
        with_preactivations: bool = False,
    ) -> tuple[dict[str, torch.Tensor], CoreState]:
        """One step for ``B`` environments: ``obs [B, *obs_shape]``, ``first [B] bool`` and, with
        ``model.last_action_reward``, ``last_action [B, *action_shape]`` and ``last_reward [B] float32``.

        Returns:
            ``{"action": [B, *action_shape], "policy_params": [B, P], "baseline": [B]}`` (the extrinsic
            value) and the new core state. Actions are sampled from the policy's distribution, or its
            mode if ``deterministic`` (:mod:`distrl.nn.distributions`). With ``with_preactivations``
            also ``"behaviour_preactivations": [B, feature_dim] float32``, the encoder's last linear
            layer's output (:meth:`forward`'s, cast to float32): PFO's anchor with
            ``agent.pfo_anchor=behaviour``.
        """
        extra = [None if x is None else x.unsqueeze(0) for x in (last_action, last_reward)]
        params, baseline, core_state, *preactivations = self(obs.unsqueeze(0), first.unsqueeze(0), core_state,
                                                             *extra, with_preactivations=with_preactivations)
        params, baseline = params[0], baseline[0]
        if baseline.dim() == 2:  # [B, 2] with the intrinsic head
            baseline = baseline[:, 0]
        dist = self.action_space.distribution(params)
        action = dist.mode() if deterministic else dist.sample()
        out = {"action": action, "policy_params": params, "baseline": baseline}
        if preactivations:
            out[BEHAVIOUR_PREACTIVATIONS] = preactivations[0][0].float()
        return out, core_state
