"""QSGD upload compression: the quantiser's statistics, the wire bytes, and its wiring through hosts and clock."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rayfl.config.sections import CompressionConfig
from rayfl.core.errors import ConfigError
from rayfl.core.messages import ClientUpdate, TensorSlice, TrainTask
from rayfl.core.rng import derive_torch_generator
from rayfl.engine.build import build_backend, build_setup
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.experiment.loader import load_config
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.client import ClientContext
from rayfl.models.elastic import SubModelSpec
from rayfl.models.elastic.family import gather
from rayfl.models.families import build_family
from rayfl.system.compression import compress_update, max_levels, qsgd_dequantised, tensor_upload_bytes, upload_bytes
from tests.helpers import tiny_config, tiny_image_dataset

QSGD = CompressionConfig(kind="qsgd", levels=64, bits=8)


def _vector(n: int = 200, seed: int = 3) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------ the quantiser
def test_qsgd_is_unbiased_within_its_variance_bound() -> None:
    levels, draws = 4, 4000
    v = _vector()
    norm = float(torch.linalg.vector_norm(v))
    gen = torch.Generator().manual_seed(11)
    samples = torch.stack([qsgd_dequantised(v, levels, gen) for _ in range(draws)]).to(torch.float64)
    # per element, q = norm / s * (floor + Bernoulli(frac)): variance <= (norm / s)^2 / 4, so the mean of ``draws``
    # independent quantisations has standard deviation <= norm / (2 s sqrt(draws)); allow 6 of them everywhere
    sigma = norm / (2 * levels * math.sqrt(draws))
    err = (samples.mean(0) - v.to(torch.float64)).abs()
    assert float(err.max()) < 6 * sigma
    # and the spread is real (not a deterministic rounding that happens to be close)
    assert float(samples.std(0).max()) > 0.1 * norm / levels
    # QSGD Lemma 3.1: E||q - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2
    d = v.numel()
    mse = float(((samples - v.to(torch.float64)) ** 2).sum(1).mean())
    assert mse <= min(d / levels**2, math.sqrt(d) / levels) * norm**2


def test_qsgd_uses_at_most_levels_magnitudes_and_keeps_signs() -> None:
    v = _vector(5000)
    for levels in (1, 3, 64):
        q = qsgd_dequantised(v, levels, torch.Generator().manual_seed(levels)).to(torch.float64)
        norm = float(torch.linalg.vector_norm(v.to(torch.float64)))
        codes = q.abs() / norm * levels
        assert torch.allclose(codes, codes.round(), atol=1e-4)  # multiples of norm / s
        mags = set(codes.round().long().tolist())
        assert mags <= set(range(levels + 1))  # l in {0, ..., s}
        assert len(mags - {0}) <= levels
        nonzero = q != 0
        assert torch.equal(torch.sign(q[nonzero]), torch.sign(v[nonzero].to(torch.float64)))
    assert max_levels(8) == 127 >= QSGD.levels


def test_zero_update_stays_zero() -> None:
    gen = torch.Generator().manual_seed(0)
    zero = torch.zeros(4, 5)
    q = qsgd_dequantised(zero, 64, gen)
    assert torch.equal(q, zero) and q.dtype == zero.dtype
    # a client that did not move uploads exactly what it received
    received = {"w": torch.randn(3, 4, generator=gen)}
    update = ClientUpdate(0, 1.0, {"w": received["w"].clone()}, {}, 1, 0.0, 0)
    out = compress_update(update, received, QSGD, seed=1, round_idx=0)
    assert torch.equal(out.values["w"], received["w"])


def _update(client: int) -> tuple[ClientUpdate, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    received = {"a": torch.randn(6, 4, generator=gen), "b": torch.randn(7, generator=gen)}
    # the client trained a 3x4 slice of "a" (rows 1, 3, 4) and all of "b" (no slice: the whole tensor)
    slices = {"a": TensorSlice((np.array([1, 3, 4]), None))}
    values = {
        "a": gather(received["a"], slices["a"]) + 0.1 * torch.randn(3, 4, generator=gen),
        "b": received["b"] + 0.1 * torch.randn(7, generator=gen),
    }
    return ClientUpdate(client, 1.0, values, slices, 10, 0.5, 2), received


def test_compressed_update_is_reproducible_from_the_seed() -> None:
    update, received = _update(client=4)
    one = compress_update(update, received, QSGD, seed=9, round_idx=2)
    two = compress_update(update, received, QSGD, seed=9, round_idx=2)
    other_client = compress_update(dataclasses.replace(update, client_id=5), received, QSGD, seed=9, round_idx=2)
    other_round = compress_update(update, received, QSGD, seed=9, round_idx=3)
    for name in update.values:
        assert torch.equal(one.values[name], two.values[name])
        sent = received[name] if name not in update.slices else gather(received[name], update.slices[name])
        delta = one.values[name] - sent
        # the server receives the received slice plus the dequantised delta: a multiple of ||delta_true|| / s
        true_norm = float(torch.linalg.vector_norm(update.values[name] - sent))
        codes = delta.abs() / true_norm * QSGD.levels
        assert torch.allclose(codes, codes.round(), atol=1e-3)
        assert not torch.equal(one.values[name], update.values[name])
    assert any(not torch.equal(one.values[n], other_client.values[n]) for n in update.values)
    assert any(not torch.equal(one.values[n], other_round.values[n]) for n in update.values)
    # the draws are those of the derived generator, tensors in sorted name order
    gen = derive_torch_generator(9, "qsgd", 2, 4)
    sent_a = gather(received["a"], update.slices["a"])
    expected_a = sent_a + qsgd_dequantised(update.values["a"] - sent_a, QSGD.levels, gen)
    assert torch.equal(one.values["a"], expected_a)
    assert one.slices == update.slices and list(one.values) == list(update.values)


def test_upload_bytes_formula_and_level_validation() -> None:
    assert tensor_upload_bytes(10, QSGD) == 10 + 4
    assert tensor_upload_bytes(3, CompressionConfig(kind="qsgd", levels=3, bits=3)) == 2 + 4  # ceil(9 / 8) + 4
    assert tensor_upload_bytes(10, CompressionConfig()) == 40
    assert upload_bytes([10, 3], QSGD) == 14 + 7
    with pytest.raises(ConfigError, match="levels"):
        load_config(None, ["compression.kind=qsgd", "compression.levels=128", "compression.bits=8"])
    assert load_config(None, ["compression.kind=qsgd", "compression.levels=127"]).compression.levels == 127
    update, received = _update(client=0)
    with pytest.raises(ValueError, match="do not fit"):
        compress_update(update, received, CompressionConfig(kind="qsgd", levels=8, bits=4), seed=0, round_idx=0)


# ------------------------------------------------------------------------------------------ on the hosts
def test_host_sends_received_plus_dequantised_delta_of_a_sub_model() -> None:
    cfg = dataclasses.replace(tiny_config(kind="local"), compression=QSGD)
    setup = build_setup(cfg, tiny_image_dataset())
    family = build_family(cfg.model, setup.input_spec)
    sel = family.select(SubModelSpec.uniform(family.space, 0.5))
    task = TrainTask(client_id=4, round_idx=1, seed=cfg.seed, lr=0.05, assignment=family.assignment(sel))
    aggregate, (outcome,) = build_backend(cfg, setup).train_and_reduce([task], setup.params)
    model = family.extract(setup.params, sel)
    x, y = setup.dataset.client_train(4)
    update = setup.algorithm.local_train(ClientContext.of(task, model, setup.input_spec), x, y)
    expected = compress_update(update, setup.params, QSGD, seed=cfg.seed, round_idx=1)
    for name, tslice in task.assignment.slices.items():
        torch.testing.assert_close(gather(aggregate.params[name], tslice), expected.values[name], rtol=0, atol=1e-6)
    assert outcome.bytes_up == upload_bytes((v.numel() for v in update.values.values()), QSGD)
    assert outcome.bytes_down == 4 * sum(v.numel() for v in update.values.values())


# ------------------------------------------------------------------------------------------ end to end
def _run(tmp_path: Path, compression: CompressionConfig, **backend: object) -> RunResult:
    base = tiny_config(kind="local")
    cfg: ExperimentConfig = dataclasses.replace(
        base,
        rounds=2,
        output_dir=str(tmp_path),
        name=f"{compression.kind}-{backend.get('kind', 'local')}",
        compression=compression,
        backend=dataclasses.replace(base.backend, **backend),  # type: ignore[arg-type]
    )
    return run_experiment(cfg, write=True, dataset=tiny_image_dataset())


def _clients(run: RunResult) -> list[dict[str, str]]:
    assert run.run_dir is not None
    with (run.run_dir / "clients.csv").open() as f:
        return list(csv.DictReader(f))


def test_qsgd_run_uploads_a_quarter_of_the_bytes_in_records_and_clock(tmp_path: Path) -> None:
    plain = _run(tmp_path, CompressionConfig())
    qsgd = _run(tmp_path, QSGD)
    numels = [v.numel() for v in plain.state.params.values()]
    per_client_plain, per_client_qsgd = 4 * sum(numels), upload_bytes(numels, QSGD)
    assert 0.25 < per_client_qsgd / per_client_plain < 0.26  # 8 of 32 bits, plus a float32 norm per tensor
    for p, q in zip(plain.records, qsgd.records, strict=True):
        assert p.clients_failed == q.clients_failed == 0
        assert p.bytes_down == q.bytes_down == p.clients_run * per_client_plain
        assert p.bytes_up == p.clients_run * per_client_plain
        assert q.bytes_up == q.clients_run * per_client_qsgd
    # the clock planned the same upload: bandwidth need = bytes down + bytes up per client
    for rows, up in ((_clients(plain), per_client_plain), (_clients(qsgd), per_client_qsgd)):
        assert len(rows) == 2 * 5
        for row in rows:
            assert float(row["bandwidth_need_mb"]) * 1e6 == pytest.approx(per_client_plain + up, rel=1e-12)
    # quantisation changes the model, but training still works
    assert any(not torch.equal(plain.state.params[n], qsgd.state.params[n]) for n in plain.state.params)
    assert math.isfinite(qsgd.final_eval.loss)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_qsgd_gives_identical_params_on_local_and_ray_backends(tmp_path: Path) -> None:
    local = _run(tmp_path, QSGD)
    remote = _run(tmp_path, QSGD, kind="ray", num_hosts=2, cpus_per_host=0.25)
    for name, value in local.state.params.items():
        np.testing.assert_array_equal(value.numpy(), remote.state.params[name].numpy())
    assert [r.bytes_up for r in local.records] == [r.bytes_up for r in remote.records]
    assert local.final_eval == remote.final_eval
