"""rllte's IMPALA quick start, run on distrl: only the imports changed (rllte's example trains
Atari with ``make_atari_env``; a Gymnasium vector env stands in for it here).

    python examples/rllte_impala.py [agent steps, default 200000]
"""

import sys

import gymnasium as gym

from distrl import IMPALA

if __name__ == "__main__":
    num_train_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    # four sub-envs: distrl steps them in one actor process (envs_per_actor=4)
    env = gym.make_vec("CartPole-v1", num_envs=4)
    eval_env = gym.make("CartPole-v1")
    agent = IMPALA(env=env, eval_env=eval_env, tag="impala_cartpole", seed=1, device="cpu", num_actors=1,
                   num_learners=1)
    agent.train(num_train_steps=num_train_steps)
    print(agent.eval(num_eval_episodes=10))
