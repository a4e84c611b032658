"""Hsuanwu's distributed quick start, run on distrl: a Hydra app whose ``cfgs`` are distrl's config
(``pkg://distrl.conf``), handed with the envs to ``DistributedTrainer(cfgs, train_env, test_env)``.

    python examples/hsuanwu_trainer.py experiment=cartpole train.num_train_steps=50000
    ENV_ID=Hopper-v5 python examples/hsuanwu_trainer.py experiment=mujoco   # Box actions
"""

import os

import gymnasium as gym
import hydra
from omegaconf import DictConfig

from distrl import DistributedTrainer

ENV_ID = os.environ.get("ENV_ID", "CartPole-v1")
train_env = gym.make(ENV_ID)
test_env = gym.make(ENV_ID)


@hydra.main(version_base="1.3", config_path="pkg://distrl.conf", config_name="train")
def main(cfgs: DictConfig) -> None:
    trainer = DistributedTrainer(cfgs, train_env, test_env)
    trainer.train()
    result = trainer.test()
    print(f"test: return {result.mean_return:.1f} +- {result.std_return:.1f} over {len(result.returns)} episodes")
    print(f"saved {trainer.save()}")


if __name__ == "__main__":
    main()
