"""``logger=wandb``: the scalars of metrics.jsonl (the same as TensorBoard's) under the same names
against agent_steps, the resolved config, one W&B run per run directory continued on resume. Offline
(WANDB_MODE=offline): no network, no account. The offline run files are read back record by record."""

from __future__ import annotations

import json
import math
import struct

import pytest
from conftest import compose_train, metrics, run_distrl

from distrl.config.schema import ConfigError
from distrl.runtime.preflight import validate

RUN = ["train", "experiment=cartpole", "train.log_interval=1000", "train.num_eval_episodes=2", "logger=wandb",
       "logger.tags=[test]"]


def wandb_records(path):
    """The protobuf records of an offline W&B run file (``run-<id>.wandb``): a 7-byte header
    (":W&B", magic, version), then LevelDB-log framing (32 KiB blocks; chunks of type full, first,
    middle, last, each after a 7-byte header of checksum, length and type)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # the block's zero padding
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            yield record


def read_wandb_run(path) -> tuple[str, list[dict], dict]:
    """The run id, the logged rows and the config of an offline run file."""
    run_id, rows, config = None, [], {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return run_id, rows, config


@pytest.mark.long
def test_wandb_logs_the_same_scalars_and_a_resumed_run_continues_its_wandb_run(tmp_path):
    run_dir = tmp_path / "run"
    env = {"WANDB_MODE": "offline", "WANDB_CONFIG_DIR": str(tmp_path / "cfg"), "WANDB_CACHE_DIR": str(tmp_path / "c")}
    for steps in (3000, 6000):
        done = run_distrl([*RUN, f"train.num_train_steps={steps}", f"hydra.run.dir={run_dir}"], env=env, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
    run_id = (run_dir / "wandb_run_id").read_text().strip()
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)  # one W&B run, continued
    read = [read_wandb_run(next(r.glob("run-*.wandb"))) for r in runs]
    assert [r[0] for r in read] == [run_id, run_id]
    first, second = read[0][1], read[1][1]
    # steps never go back; an episode that ends before the resumed run's first update is logged at its resume step
    assert max(row["agent_steps"] for row in first) <= min(row["agent_steps"] for row in second)
    logged = {(row["agent_steps"], key, value) for _, rows, _ in read for row in rows for key, value in row.items()
              if not key.startswith("_")}
    records = metrics(run_dir)
    expected = {(r["agent_steps"], key, value) for r in records for key, value in r.items()
                if key not in ("time",) and isinstance(value, (int, float)) and math.isfinite(value)}
    assert expected <= logged  # every scalar of metrics.jsonl (TensorBoard's names) at its agent step
    config = read[1][2]
    assert config["agent"]["lr"] == 0.005 and config["env"]["id"] == "CartPole-v1" and config["logger"]["tags"] == [
        "test"]


def test_a_bad_logger_is_refused():
    with pytest.raises(ConfigError, match="logger.mode='sideways' is not allowed: null, online, offline, disabled"):
        validate(compose_train(["experiment=cartpole", "logger=wandb", "logger.mode=sideways"]))
