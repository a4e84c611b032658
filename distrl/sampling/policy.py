"""How the policy is stepped on envs, by the actors and by evaluation alike: :func:`step_policy` is
the one loop step, :class:`AgentState` what one step hands the next (the LSTM state, the previous
action and reward, episode starts), :func:`final_values` the values a time-limited episode is
bootstrapped from. The network (:class:`distrl.nn.actor_critic.ActorCritic`) knows nothing of envs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from distrl.nn.actor_critic import ActorCritic, CoreState
from distrl.nn.precision import autocast


class AgentState:
    """What one policy step hands the next, for each of ``N`` environments.

    Attributes:
        first: ``[N] bool``, whether the env's next observation starts an episode (True at first).
        last_action: ``[N, *action_shape]``, the action taken before it (0 at an episode's start).
        last_reward: ``[N] float32``, the raw reward that action gave (0 at an episode's start).
        core: the LSTM state ``(h, c)``, each ``[1, N, H]``; ``()`` without an LSTM.

    All on the device of ``model``.
    """

    def __init__(self, model: ActorCritic, num_envs: int):
        device = model.policy.weight.device
        self.first = torch.ones(num_envs, dtype=torch.bool, device=device)
        space = model.action_space
        self.last_action = torch.zeros((num_envs, *space.action_shape), dtype=space.action_dtype, device=device)
        self.last_reward = torch.zeros(num_envs, dtype=torch.float32, device=device)
        self.core = model.initial_state(num_envs)

    def after_env_step(self, actions: torch.Tensor, rewards: Any, ended: Any, ids: torch.Tensor | None = None) -> None:
        """Record what stepping envs ``ids`` (``[k] int64``; None: all) with ``actions`` (``[k, *action_shape]``)
        gave: ``rewards`` (``[k]``) and whether the episode ``ended`` (``[k] bool``; the env's next
        observation then starts a new one, with nothing before it). Arrays or tensors."""
        device = self.first.device
        where = slice(None) if ids is None else ids
        ended = torch.as_tensor(ended, dtype=torch.bool, device=device)
        rewards = torch.as_tensor(rewards, dtype=torch.float32, device=device)
        as_action = ended.view(-1, *[1] * (self.last_action.dim() - 1))
        self.last_action[where] = torch.where(as_action, 0, actions.to(device, self.last_action.dtype))
        self.last_reward[where] = torch.where(ended, 0.0, rewards)
        self.first[where] = ended

    def restore_core(self, ids: torch.Tensor, core: CoreState) -> None:
        """Put back the LSTM state ``core`` (each ``[1, k, H]``) of envs ``ids`` (``[k] int64``) as it was
        before a step, so that the step can be acted again (synchronous collection); nothing without an LSTM."""
        if core:
            self.core = tuple(c.index_copy(1, ids.to(c.device), s) for c, s in zip(self.core, core, strict=True))


@dataclass
class StepInputs:
    """What the policy saw besides the observations at one step of ``k`` envs (see
    :class:`AgentState`): ``first [k]``, ``last_action [k]``, ``last_reward [k]`` and the LSTM
    state before the step, ``core`` (each ``[1, k, H]``, or ``()``)."""

    first: torch.Tensor
    last_action: torch.Tensor
    last_reward: torch.Tensor
    core: CoreState


@torch.no_grad()
def step_policy(model: ActorCritic, obs: torch.Tensor, state: AgentState, ids: torch.Tensor | None = None,
                deterministic: bool = False, precision: str = "fp32",
                preactivations: bool = False) -> tuple[dict[str, torch.Tensor], StepInputs]:
    """One policy step for envs ``ids`` (``[k] int64``; None: all of ``state``'s envs).

    Args:
        model: the network to act with (an actor copy, or a frozen copy for evaluation).
        obs: ``[k, *obs_shape]``, those envs' observations.
        state: the envs' state; their LSTM state advances here.
        deterministic: greedy actions instead of sampling.
        precision: ``fp32`` or ``bf16`` (:func:`autocast`); the outputs are float32 either way.
        preactivations: also the encoder's pre-activations, ``"behaviour_preactivations": [k, F]``.

    Returns:
        ``{"action": [k, *action_shape], "policy_params": [k, P], "baseline": [k]}`` (:meth:`ActorCritic.act`)
        and what the policy saw besides ``obs`` (:class:`StepInputs`), which the actors store beside
        the observation.
    """
    where = slice(None) if ids is None else ids
    seen = StepInputs(state.first[where].clone(), state.last_action[where].clone(), state.last_reward[where].clone(),
                      tuple(c[:, where] for c in state.core))
    with autocast(precision, state.first.device):
        out, core = model.act(obs.to(state.first.device), seen.first, seen.core, deterministic,
                              seen.last_action, seen.last_reward, preactivations)
    if core:
        state.core = core if ids is None else tuple(c.index_copy(1, ids, n) for c, n in zip(state.core, core,
                                                                                           strict=True))
    return out, seen


@torch.no_grad()
def final_values(model: ActorCritic, final_obs: torch.Tensor, state: AgentState, ids: torch.Tensor,
                 actions: torch.Tensor, rewards: torch.Tensor, precision: str = "fp32") -> torch.Tensor:
    """The baselines ``[k]`` of the final observations ``final_obs [k, *obs_shape]`` of envs ``ids``
    whose episode was cut by a time limit, as if it went on: with the envs' LSTM state after their
    last step and the ``actions`` and ``rewards`` (``[k]``) that led there. V-trace bootstraps a
    truncated trajectory from these values instead of the next episode's first state."""
    no_reset = torch.zeros(len(ids), dtype=torch.bool, device=state.first.device)
    with autocast(precision, state.first.device):
        out, _ = model.act(final_obs, no_reset, tuple(c[:, ids] for c in state.core), False, actions, rewards)
    return out["baseline"]
