"""Resumed ≡ uninterrupted, bit for bit, for every registered algorithm: a run resumed from a checkpoint writes the
same records (wall-clock columns aside) and ends with the same global state as the run that never stopped."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest

from rayfl.cli import main
from rayfl.config.sections import CheckpointConfig
from rayfl.core.errors import ConfigError
from rayfl.data.federated import FederatedDataset
from rayfl.engine.driver import run_experiment
from rayfl.engine.persist.checkpoint import CheckpointStore
from tests.helpers import tiny_image_dataset
from tests.resume_cases import assert_same_run, case, case_names, keep_checkpoints_up_to

# where the resumed copy starts: mid-run; the phased FedorAS run (supernet 2 rounds, search 3, fine-tuning 2) once
# inside the search (its populations in the state), once at the hand-over to fine-tuning (the search's result in the
# checkpoint) and once inside fine-tuning (the tier models in the state)
RESUME_AFTER = {"fedoras": 3, "fedoras_search": 5, "fedoras_finetune": 6}


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    return tiny_image_dataset()


@pytest.mark.parametrize("name", case_names())
def test_a_resumed_run_equals_the_uninterrupted_one(name: str, data: FederatedDataset, tmp_path: Path) -> None:
    cfg = dataclasses.replace(case(name, data), output_dir=str(tmp_path))
    full = run_experiment(cfg, dataset=data)
    assert full.run_dir is not None
    copy = tmp_path / "resumed"
    shutil.copytree(full.run_dir, copy)
    after = RESUME_AFTER.get(name, 2)
    keep_checkpoints_up_to(copy, after)
    resumed = run_experiment(cfg, dataset=data, resume=copy)
    assert [r.round_idx for r in resumed.records] == list(range(cfg.rounds))
    assert_same_run(full.run_dir, copy, full, resumed)


def test_checkpoints_do_not_change_the_records(data: FederatedDataset, tmp_path: Path) -> None:
    cfg = dataclasses.replace(case("fedavg", data), output_dir=str(tmp_path))
    with_checkpoints = run_experiment(cfg, dataset=data)
    without = run_experiment(dataclasses.replace(cfg, name="none", checkpoint=CheckpointConfig(every=0)), dataset=data)
    assert with_checkpoints.run_dir is not None and without.run_dir is not None
    assert not (without.run_dir / "checkpoints").exists()
    assert all(r.checkpoint_bytes > 0 and r.checkpoint_s > 0 for r in with_checkpoints.records)
    assert all(r.checkpoint_bytes == 0 and math.isnan(r.checkpoint_s) for r in without.records)
    # each checkpoint's commit (record files to disk, manifest) is timed apart: it follows the round's record
    assert sorted(with_checkpoints.checkpoint_commit_s) == list(range(cfg.rounds)) and without.checkpoint_commit_s == {}
    assert all(s > 0 for s in with_checkpoints.checkpoint_commit_s.values())
    assert_same_run(with_checkpoints.run_dir, without.run_dir, with_checkpoints, without)


def _flip(path: Path, offset: int, flip: int) -> None:
    """Flip the bits ``flip`` of the byte at ``offset`` (from the end where negative), keeping the file's size."""
    raw = bytearray(path.read_bytes())
    raw[offset] ^= flip
    path.write_bytes(bytes(raw))


def _redigest(manifest_path: Path, **changes: object) -> None:
    """Rewrite a manifest with ``changes``, its own digest made to match (as a careful editor would)."""
    body = {k: v for k, v in json.loads(manifest_path.read_text()).items() if k != "manifest_sha256"} | changes
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    manifest_path.write_text(json.dumps({**body, "manifest_sha256": digest}))


def test_the_store_keeps_the_last_k_and_skips_a_damaged_or_uncommitted_checkpoint(
    data: FederatedDataset, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = dataclasses.replace(
        case("fedavg", data), rounds=5, output_dir=str(tmp_path), checkpoint=CheckpointConfig(every=1, keep=3)
    )
    result = run_experiment(cfg, dataset=data)
    assert result.run_dir is not None
    store = CheckpointStore(result.run_dir, keep=3)
    assert [p.name for p in store.manifests()] == ["round-000003.json", "round-000004.json", "round-000005.json"]
    assert sorted(p.name for p in store.dir.glob("*.safetensors")) == [f"round-00000{k}.safetensors" for k in (3, 4, 5)]
    assert not list(store.dir.glob("*.tmp"))
    # Round 5: the safetensors header's size (its last byte) made huge, and the manifest's digest of the state file
    # made to match: only reading the file finds the damage.
    state5 = store.dir / "round-000005.safetensors"
    _flip(state5, 7, 0x7F)
    _redigest(store.dir / "round-000005.json", state_sha256=hashlib.sha256(state5.read_bytes()).hexdigest())
    found = store.latest()
    assert found is not None and found[0].rounds_done == 4
    assert "round-000005.safetensors: its header claims" in caplog.text
    # Round 4: one bit of a tensor's bytes (at the end of the file) flipped. It would load; the digest catches it.
    _flip(store.dir / "round-000004.safetensors", -3, 0x40)
    (store.dir / "round-000006.safetensors").write_bytes(b"no manifest")  # a stop between state file and manifest
    found = store.latest()
    assert found is not None and found[0].rounds_done == 3
    assert "round-000004.safetensors does not match the manifest's SHA-256 digest" in caplog.text
    resumed = run_experiment(cfg, dataset=data, resume=result.run_dir)  # from round 3: the last two rounds again
    assert_same_run(result.run_dir, result.run_dir, result, resumed)
    assert [p.name for p in store.manifests()][-1] == "round-000005.json"
    assert store.latest()[0].rounds_done == 5  # type: ignore[index]  # the rewritten checkpoints read back


def test_a_resume_with_another_config_or_without_checkpoints_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = dataclasses.replace(case("fedavg", None, rounds=2), output_dir=str(tmp_path))  # synthetic data, as a file
    result = run_experiment(cfg)
    assert result.run_dir is not None
    changed = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lr=0.1))
    with pytest.raises(ConfigError, match=r"train\.lr: the run was started with 0\.05 and is resumed with 0\.1"):
        run_experiment(changed, resume=result.run_dir)
    moved = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, num_hosts=1))  # backend.* may change
    assert len(run_experiment(moved, resume=result.run_dir).records) == 2
    with pytest.raises(RuntimeError):  # a run that stopped in its first round, with no checkpoint to resume from
        run_experiment(dataclasses.replace(cfg, name="bare", checkpoint=CheckpointConfig(every=0)), callbacks=[_stop])
    assert main(["run", "--resume", str(tmp_path / "bare")]) == 2
    assert main(["run", "--resume", str(tmp_path / "nowhere")]) == 2
    assert main(["run", "--resume", str(result.run_dir), "train.lr=0.1"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("rayfl: error: ") for line in err)
    assert "holds no readable checkpoint" in err[0] and "not a run directory" in err[1] and "train.lr" in err[2]
    assert "resuming" not in captured.out  # refused before it says it resumes
    # a finished run: nothing to do, said without starting anything
    assert main(["run", "--resume", str(result.run_dir)]) == 0
    assert "finished all 2 rounds already: nothing to resume" in capsys.readouterr().out


def _stop(record: object) -> None:
    raise RuntimeError("stopped in the first round")


def test_a_run_written_before_a_key_existed_resumes_with_that_keys_default(tmp_path: Path) -> None:
    """A run directory whose ``config.yaml`` predates keys added since (a whole section such as ``server``, a field
    such as ``data.split``) resumes: a missing key counts as its default, what the run ran with; a key that was
    written and differs is still refused."""
    import yaml

    cfg = dataclasses.replace(case("fedavg", None, rounds=3), output_dir=str(tmp_path))
    result = run_experiment(cfg)
    assert result.run_dir is not None
    keep_checkpoints_up_to(result.run_dir, 2)
    path = result.run_dir / "config.yaml"
    saved = yaml.safe_load(path.read_text())
    del saved["server"], saved["data"]["split"]
    path.write_text(yaml.safe_dump(saved, sort_keys=False))
    from rayfl.engine.persist.resume import check_same_config

    check_same_config(cfg, result.run_dir)  # accepted
    changed = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, policy="overcommit"))
    with pytest.raises(ConfigError, match=r"server\.policy: the run was started with 'sync'"):
        check_same_config(changed, result.run_dir)
