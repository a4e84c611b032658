"""rlpack's distributed simulator, run on distrl: ``n_procs`` ranks on this machine, each an agent
with its own envs, their gradients averaged by torch.distributed (gloo).

    python examples/rlpack_simulator.py [agent steps, default 100000]
"""

import sys

from distrl import SimulatorDistributed

if __name__ == "__main__":
    config = {
        "env": "CartPole-v1",
        "num_actors": 1,
        "train": {"num_train_steps": int(sys.argv[1]) if len(sys.argv) > 1 else 100_000},
        "run_dir": "outputs/rlpack-cartpole",
    }
    simulator = SimulatorDistributed(n_procs=2, config=config, backend="gloo")
    sys.exit(simulator.run())
