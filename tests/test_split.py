"""``learner_split``: an optimizer step's network work in parts of the minibatch on threads gives the
unsplit step's losses and weights (within float rounding: the parameters' gradient is a sum over
the parts in another order)."""

import pytest
import torch
from conftest import compose_train

from distrl.config.placement import plan
from distrl.config.schema import ConfigError
from distrl.config.validation import validate_config
from distrl.learning.learner import make_learner, make_optimizer
from distrl.learning.schedule import Schedule
from distrl.learning.split import SplitStep
from distrl.learning.step import StepOptions
from distrl.nn.actor_learner import ActorLearner

T, B, OBS, A = 5, 6, 4, 3


def _batch(policy, lstm: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(T + 1, B, OBS, generator=g)
    first = torch.rand(T + 1, B, generator=g) < 0.2
    core = policy.learner.initial_state(B) if lstm else ()
    with torch.no_grad():
        logits, values, _ = policy.learner(obs, first, core)
    batch = {"obs": obs, "first": first, "action": torch.randint(0, A, (T + 1, B), generator=g),
             "policy_params": logits + 0.3 * torch.randn(logits.shape, generator=g),  # off-policy: rho != 1
             "baseline": values, "reward": torch.rand(T + 1, B, generator=g) * 2 - 1,
             "terminated": torch.rand(T + 1, B, generator=g) < 0.1,
             "truncated": torch.zeros(T + 1, B, dtype=torch.bool), "truncation_value": torch.zeros(T + 1, B),
             "policy_version": torch.zeros(B, dtype=torch.int64), "env_id": torch.arange(B)}
    if lstm:
        batch["core_h"], batch["core_c"] = (state + 0.1 for state in core)
    return batch


def _updated(overrides: list[str], split: SplitStep | None) -> tuple[dict, list[torch.Tensor]]:
    cfg = compose_train(["experiment=cartpole", "agent=appo", "agent.num_epochs=2", "agent.num_minibatches=2",
                         f"num_steps={T}", f"batch_size={B}", *overrides])
    cfg.train.num_train_steps = 10**9
    torch.manual_seed(0)
    policy = ActorLearner((OBS,), A, cfg.model)
    policy.share_actor()
    learner = make_learner(policy, make_optimizer(policy, cfg.agent), Schedule.for_run(cfg), cfg.agent,
                      StepOptions(torch.device("cpu"), split=split))
    losses = learner.update(_batch(policy, bool(cfg.model.use_lstm)))
    return losses, [p.detach().clone() for p in policy.learner.parameters()]


@pytest.mark.parametrize("overrides", [[], ["model.use_lstm=true"], ["agent.minibatch=steps"], ["agent.pfo_coef=1"],
                                       ["agent.minibatch=steps", "agent.pfo_coef=1"]],
                         ids=["unrolls", "lstm", "steps", "pfo", "pfo-steps"])
def test_a_split_step_gives_the_unsplit_losses_and_weights(overrides):
    """4 optimizer steps (2 epochs x 2 minibatches) of APPO on an off-policy batch; the split one
    in 2 parts (3 unrolls or steps each) or 3, on 2 threads; LSTM states split with their unrolls."""
    want_losses, want_weights = _updated(overrides, None)
    for parts in (2, 3):
        split = SplitStep(parts, threads=2)
        try:
            losses, weights = _updated(overrides, split)
        finally:
            split.close()
        for key in ("total", "policy", "value", "entropy", "grad_norm", "clip_fraction", "approx_kl"):
            assert losses[key] == pytest.approx(want_losses[key], rel=1e-5, abs=1e-6), key
        for got, want in zip(weights, want_weights, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert any(not torch.equal(w, w0) for w, w0 in zip(weights, _initial(overrides), strict=True))


def _initial(overrides: list[str]) -> list[torch.Tensor]:
    cfg = compose_train(["experiment=cartpole", "agent=appo", *overrides])
    torch.manual_seed(0)
    return [p.detach().clone() for p in ActorLearner((OBS,), A, cfg.model).learner.parameters()]


def test_learner_split_is_validated_and_sizes_the_threads():
    with pytest.raises(ConfigError, match="learner_split=0 is not allowed"):
        validate_config(compose_train(["experiment=cartpole", "learner_split=0"]))
    with pytest.raises(ConfigError, match="learner_split=2 is not allowed: 1 or auto with train.th_compile=true"):
        validate_config(compose_train(["experiment=cartpole", "learner_split=2", "train.th_compile=true"]))
    p = plan(compose_train(["experiment=cartpole", "learner_split=4", "learner_threads=2"]))
    assert (p.learner_split, p.learner_threads) == (4, 2)
    # IMPALA's one step a batch, and a compiled step, are not split
    assert plan(compose_train(["experiment=cartpole", "precision=fp32"]), cores=2).learner_split == 1
    assert plan(compose_train(["train.th_compile=true", "precision=fp32"]), cores=2).learner_split == 1
    for small in ("experiment=mujoco", "experiment=minigrid"):  # APPO, but a step too short to share
        assert plan(compose_train([small, "precision=fp32"]), cores=2).learner_split == 1, small
    p = plan(compose_train(["device=cpu", "precision=fp32"]), cores=2)  # APPO, Pong's Nature CNN: both cores
    assert (p.learner_split, p.learner_threads) == (2, 2)
    p = plan(compose_train(["device=cpu", "precision=bf16"]), cores=2)  # bf16 too: 1.34x on an AVX512-BF16 EPYC
    assert (p.learner_split, p.learner_threads) == (2, 2)
    p = plan(compose_train(["device=cpu", "precision=fp32"]), cores=1)  # one core: nothing to share
    assert (p.learner_split, p.learner_threads) == (1, 1)


def test_the_atari_networks_gradients_are_laid_out_as_its_parameters_for_the_fused_adam():
    """The fused Adam (make_optimizer's) pairs a parameter with its gradient by memory order: the split
    step leaves every gradient in its parameter's layout (channels-last for the Nature CNN's
    convolutions), and a fused step then gives the loop kernel's weights within float rounding."""
    cfg = compose_train([])
    torch.manual_seed(0)
    policy = ActorLearner((4, 84, 84), 6, cfg.model)
    params = list(policy.learner.parameters())
    assert any(not p.is_contiguous() for p in params)  # channels-last weights: the case that matters
    obs = torch.randint(0, 256, (3, 4, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    batch = {"obs": obs, "first": torch.zeros(3, 4, dtype=torch.bool)}

    def forward(piece):
        logits, values, _ = policy.learner(piece["obs"], piece["first"], ())
        return logits, values

    split = SplitStep(2, threads=2)
    try:
        split.loss_and_gradients(forward, lambda logits, values: (logits.float().pow(2).mean()
                                                                   + values.float().pow(2).mean(),), batch, params)
    finally:
        split.close()
    assert all(p.grad.stride() == p.stride() for p in params)
    loop = [p.detach().clone().requires_grad_() for p in params]  # clone keeps each layout
    for copy, p in zip(loop, params, strict=True):
        copy.grad = p.grad.clone()
    torch.optim.Adam(loop, lr=cfg.agent.lr, eps=cfg.agent.eps, foreach=False).step()  # PyTorch's CPU loop
    make_optimizer(policy, cfg.agent).step()
    for got, want in zip(params, loop, strict=True):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-6, atol=1e-7)
