"""The README's Python API example, run exactly as printed there."""

import re
import subprocess
import sys

import pytest
from conftest import REPO

from distrl.utils.checkpoint import load_checkpoint


def readme_example() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.long
def test_the_readme_example_trains_tests_and_saves(tmp_path):
    (tmp_path / "example.py").write_text(readme_example())
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "outputs" / "api-cartpole"
    assert re.search(r"return \d+\.\d \+- \d+\.\d over 10 episodes", done.stdout), done.stdout
    log = (run_dir / "train.log").read_text()
    assert "run directory" in log and "training done" in log
    assert "training done" in done.stderr  # and on the console, like the CLI
    final = load_checkpoint(run_dir / "final.pt")
    assert final["agent_steps"] >= 20000 and final["config"]["env"]["id"] == "CartPole-v1"


def test_a_bad_value_fails_with_the_commands_message():
    from distrl import compose_config
    from distrl.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"^batch_size=0 is not allowed"):
        compose_config(["batch_size=0"])

