"""rllte's IMPALA on a continuous-control task (Box actions), run on distrl: only the import changed.
A vector env of a MuJoCo task starts from distrl's continuous-control preset (experiment=mujoco:
observation normalisation, a diagonal Gaussian policy, the mean in evaluation), with IMPALA's loss
as rllte's IMPALA trains it.

    python examples/rllte_impala_mujoco.py [agent steps, default 200000] [env id, default HalfCheetah-v5]
"""

import sys

import gymnasium as gym

from distrl import IMPALA

if __name__ == "__main__":
    num_train_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    env_id = sys.argv[2] if len(sys.argv) > 2 else "HalfCheetah-v5"
    env = gym.make_vec(env_id, num_envs=8)  # eight sub-envs, stepped in one actor process
    eval_env = gym.make(env_id)
    agent = IMPALA(env=env, eval_env=eval_env, tag="impala_mujoco", seed=1, device="cpu", num_actors=1,
                   num_learners=1)
    agent.train(num_train_steps=num_train_steps)
    print(agent.eval(num_eval_episodes=10))
