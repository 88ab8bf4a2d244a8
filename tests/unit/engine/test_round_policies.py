"""Round policies (``server.policy``, ``rayfl/engine/policies/``): over-commitment and asynchronous buffered
aggregation on the simulated clock, for any method, with sync as their limiting case bit for bit."""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rayfl.config.sections import CheckpointConfig, ResourceConfig, ServerConfig, SystemConfig
from rayfl.core.messages import Assignment
from rayfl.data.federated import FederatedDataset, from_client_arrays
from rayfl.engine.build import build_clock, build_setup
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.engine.policies.staleness import staleness_weight
from rayfl.engine.policies.sync import first_to_finish, overcommitted_sample
from rayfl.experiment.loader import load_config
from rayfl.experiment.schema import ExperimentConfig
from tests.helpers import tiny_config, tiny_image_dataset
from tests.resume_cases import WALL_CLOCK_COLUMNS, assert_same_run, assert_same_state, case, keep_checkpoints_up_to

# columns only an asynchronous policy fills differently from sync (clients still in flight, each update's share)
POLICY_COLUMNS = ["in_flight", "agg_weight"]
HETEROGENEOUS = SystemConfig(
    compute=ResourceConfig(source="uniform", low=0.02, high=0.2, per_round=False),  # GFLOP/s: seconds per round
    bandwidth_down=ResourceConfig(source="uniform", low=1.0, high=8.0, per_round=False),
)


def _written(cfg: ExperimentConfig, tmp_path: Path, name: str, data: FederatedDataset) -> RunResult:
    return run_experiment(dataclasses.replace(cfg, name=name, output_dir=str(tmp_path)), dataset=data)


def _same_records(a: Path, b: Path) -> None:
    """Two run directories' rounds and clients tables are equal bit for bit, wall-clock and policy columns aside."""
    for table in ("rounds", "clients"):
        x, y = (pd.read_csv(d / f"{table}.csv", keep_default_na=False) for d in (a, b))
        drop = [*WALL_CLOCK_COLUMNS, *POLICY_COLUMNS]
        x, y = (f.drop(columns=[c for c in drop if c in f.columns]) for f in (x, y))
        pd.testing.assert_frame_equal(x, y, check_exact=True)


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    return tiny_image_dataset()


# finite memory budgets with a runtime overhead inside every need: utilisation and the overhead's share are recorded
WITH_OVERHEAD = dataclasses.replace(
    HETEROGENEOUS,
    memory=ResourceConfig(source="uniform", low=2.0, high=4.0, per_round=False),  # MiB: everyone fits
    memory_overhead_mib=1.0,
)


@pytest.mark.parametrize("system", [HETEROGENEOUS, WITH_OVERHEAD], ids=["no_overhead", "memory_overhead"])
def test_fedbuff_with_b_equal_c_equal_k_and_no_staleness_weight_is_sync_bit_for_bit(
    data: FederatedDataset, tmp_path: Path, system: SystemConfig
) -> None:
    """B = C = K, clients refilled once their update is applied, s(tau) = 1: every step is a sync round, in
    ``rounds.csv`` and ``clients.csv`` alike; with ``system.memory_overhead_mib > 0`` too (issue 43 item 2: the
    asynchronous rows once lost the plan's memory overhead, reporting the need over the whole budget as utilisation
    and an overhead share of 0)."""
    cfg = dataclasses.replace(tiny_config(kind="local", num_hosts=2), rounds=4, system=system)
    sync = _written(cfg, tmp_path, "sync", data)
    server = ServerConfig(policy="fedbuff", concurrency=5, buffer_size=5, staleness="none", refill="applied")
    buff = _written(dataclasses.replace(cfg, server=server), tmp_path, "fedbuff", data)
    assert sync.run_dir is not None and buff.run_dir is not None
    _same_records(sync.run_dir, buff.run_dir)
    assert_same_state(sync.state.params, buff.state.params)
    rounds = pd.read_csv(buff.run_dir / "rounds.csv")
    assert rounds["sim_duration_s"].gt(0).all() and rounds["staleness_max"].eq(0).all()
    clients = pd.read_csv(buff.run_dir / "clients.csv")
    assert (clients["start_version"] == clients["round_idx"]).all()
    np.testing.assert_allclose(clients.groupby("round_idx")["agg_weight"].sum(), 1.0)
    if system.memory_overhead_mib > 0:  # the compared columns really carry the overhead
        assert rounds["memory_overhead_share"].between(0.25, 0.5).all(), rounds["memory_overhead_share"]
        assert rounds["memory_util"].between(0.0, 1.0, inclusive="neither").all()
        assert clients["memory_util"].between(0.0, 1.0, inclusive="neither").all()


def test_overcommit_zero_is_sync_and_overcommit_keeps_the_first_k_to_finish(
    data: FederatedDataset, tmp_path: Path
) -> None:
    cfg = dataclasses.replace(tiny_config(kind="local"), rounds=3, clients_per_round=4, system=HETEROGENEOUS)
    sync = _written(cfg, tmp_path, "sync", data)
    zero = _written(
        dataclasses.replace(cfg, server=ServerConfig(policy="overcommit", overcommit=0.0)), tmp_path, "o0", data
    )
    assert sync.run_dir is not None and zero.run_dir is not None
    assert_same_run(sync.run_dir, zero.run_dir, sync, zero)
    over = _written(
        dataclasses.replace(cfg, server=ServerConfig(policy="overcommit", overcommit=0.5)), tmp_path, "o5", data
    )
    assert over.run_dir is not None
    clients = pd.read_csv(over.run_dir / "clients.csv", keep_default_na=False)
    for r, rows in clients.groupby("round_idx"):
        assert len(rows) == 6  # ceil(4 x 1.5) sampled
        finish = rows["download_s"] + rows["compute_s"] + rows["upload_s"]
        kept = rows[rows["failure"] == ""]
        dropped = rows[rows["failure"] == "overcommit"]
        assert len(kept) == 4 and len(dropped) == 2
        assert finish[kept.index].max() <= finish[dropped.index].min()  # the first four to finish were kept
        record = over.records[int(r)]
        assert record.sim_duration_s == pytest.approx(finish[kept.index].max())  # the round ends at the fourth
        assert record.clients_run == 4 and record.failed_other == 2


def test_first_to_finish_breaks_ties_by_client_id_and_counts_the_sample() -> None:
    clock = build_clock(tiny_config(kind="local"), build_setup(tiny_config(kind="local"), tiny_image_dataset()))
    views = clock.check_in(0, np.array([3, 5, 7, 9]), [20] * 4)
    plan = clock.plan(0, views, {c: Assignment() for c in (3, 5, 7, 9)})  # equal durations: ties everywhere
    kept = first_to_finish(plan, 2)
    assert kept.failure == (None, None, "overcommit", "overcommit")
    assert overcommitted_sample(10, 0.0) == 10 and overcommitted_sample(10, 0.3) == 13
    assert overcommitted_sample(4, 0.5) == 6 and overcommitted_sample(3, 0.34) == 5


def test_staleness_weights() -> None:
    tau = np.array([0, 1, 3, 4, 5, 8])
    np.testing.assert_allclose(staleness_weight(ServerConfig(staleness="none"), tau), 1.0)
    np.testing.assert_allclose(staleness_weight(ServerConfig(), tau), 1.0 / np.sqrt(1.0 + tau))
    hinge = ServerConfig(staleness="hinge", hinge_a=10.0, hinge_b=4)
    np.testing.assert_allclose(staleness_weight(hinge, tau), [1, 1, 1, 1, 1 / 11, 1 / 41])


def _equal_clients(num_clients: int, per_client: int = 16) -> FederatedDataset:
    """Clients with equal data (so equal training FLOPs), labels from a fixed teacher."""
    rng = np.random.default_rng(0)
    teacher = rng.normal(size=(3 * 8 * 8, 4))

    def make(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.integers(0, 256, size=(n, 3, 8, 8), dtype=np.uint8)
        return x, (x.reshape(n, -1).astype(np.float64) @ teacher).argmax(1).astype(np.int64)

    train = [make(per_client) for _ in range(num_clients)]
    x_test, y_test = make(32)
    return from_client_arrays("equal", "image", 4, train, x_test, y_test, meta={"mean": [0.5] * 3, "std": [0.25] * 3})


def test_a_hand_made_four_client_timeline(tmp_path: Path) -> None:
    """Four clients with equal work and compute speeds 4, 2, 1, 4 GFLOP/s train for 1, 2, 4 and 1 time units u;
    C = 4 in flight, B = 2, FedBuff's 1/sqrt(1 + tau), refilled on arrival. Worked by hand (module docstring of
    ``engine/policies/buffered.py``: a client cannot restart on the version it already started on):

    - step 0: all four start at 0 on v0; c0 and c3 arrive at 1 (tau 0); c0 and c3 restart at 1 on v1.
    - step 1: at 2 arrive c0 (v1, tau 0) and c1 (v0, tau 1); c0 and c1 restart at 2 on v2.
    - step 2: c3 (v1) at 2 (tau 1), c0 (v2) at 3 (tau 0); c0 and c3 restart at 3 on v3.
    - step 3: c0 (v3) at 4 (tau 0), then c1 (v2) at 4 (tau 1; ties by client id); c0 and c1 restart at 4 on v4.
    - step 4: c2 (v0) at 4 (tau 4), c3 (v3) at 4 (tau 1).
    Equal weights, so each update's share is s(tau) / 2."""
    data = _equal_clients(4)
    system = SystemConfig(compute=ResourceConfig(source="levels", values=(4.0, 2.0, 1.0, 4.0), id_bounds=(1, 2, 3)))
    server = ServerConfig(policy="fedbuff", concurrency=4, buffer_size=2)
    cfg = dataclasses.replace(tiny_config(kind="local"), rounds=5, clients_per_round=4, system=system, server=server)
    result = _written(cfg, tmp_path, "timeline", data)
    assert result.run_dir is not None
    clients = pd.read_csv(result.run_dir / "clients.csv", keep_default_na=False)
    u = float(clients.loc[(clients["round_idx"] == 0) & (clients["client_id"] == 0), "compute_s"].iloc[0])
    assert u > 0 and clients["download_s"].eq(0).all()
    expected = [  # step, client, start version, staleness, start in u
        (0, 0, 0, 0, 0), (0, 3, 0, 0, 0),
        (1, 0, 1, 0, 1), (1, 1, 0, 1, 0),
        (2, 3, 1, 1, 1), (2, 0, 2, 0, 2),
        (3, 0, 3, 0, 3), (3, 1, 2, 1, 2),
        (4, 2, 0, 4, 0), (4, 3, 3, 1, 3),
    ]  # fmt: skip
    clients["arrive_s"] = clients["start_s"] + clients["download_s"] + clients["compute_s"] + clients["upload_s"]
    clients = clients.sort_values(["round_idx", "arrive_s", "client_id"], kind="stable")  # rows: client-id order
    got = [
        (r.round_idx, r.client_id, r.start_version, int(r.staleness), round(r.start_s / u, 9))
        for r in clients.itertuples()
    ]
    assert got == [(s, c, v, t, float(b)) for s, c, v, t, b in expected]  # arrival order within each step
    np.testing.assert_allclose(clients["agg_weight"], [0.5 / math.sqrt(1.0 + t) for _, _, _, t, _ in expected])
    rounds = pd.read_csv(result.run_dir / "rounds.csv")
    np.testing.assert_allclose(rounds["sim_time_s"] / u, [1, 2, 3, 4, 4])
    np.testing.assert_allclose(rounds["staleness_mean"], [0, 0.5, 0.5, 0.5, 2.5])
    np.testing.assert_allclose(rounds["staleness_max"], [0, 1, 1, 1, 4])
    assert rounds["in_flight"].tolist() == [4, 4, 4, 4, 2]  # nobody is refilled after the last step


def test_a_client_whose_memory_dips_before_its_late_start_fails_as_in_sync(tmp_path: Path) -> None:
    """Memory high until T, below the model's need after: a client checked in after T fails ``memory`` at its own
    start, in FedAsync as in a sync round starting after T (one whose training spans T fails ``memory_dip``)."""
    data = _equal_clients(4)
    base = dataclasses.replace(tiny_config(kind="local"), rounds=4, clients_per_round=2)
    need = build_clock(base, build_setup(base, data)).oracle.costs([Assignment()]).memory[0] / 2.0**20
    speed = ResourceConfig(source="constant", low=0.05)
    first = build_clock(dataclasses.replace(base, system=SystemConfig(compute=speed)), build_setup(base, data))
    views = first.check_in(0, np.array([0]), [16])
    d = float(first.plan(0, views, {0: Assignment()}).compute_s[0])  # one client's training time
    trace = tmp_path / "memory.csv"
    dip_at = 1.5 * d  # after the first clients' arrival, before any later start's
    header = "# rayfl-trace v1\n# kind: memory\n# unit: MiB\nt_s,value\n"
    trace.write_text(f"{header}0,{2 * need}\n{dip_at},{0.5 * need}\n1e9,{0.5 * need}\n")
    memory = ResourceConfig(source="trace", file=str(trace), offset="zero")
    system = SystemConfig(compute=speed, memory=memory)
    sync = _written(dataclasses.replace(base, system=system), tmp_path, "sync", data)
    fedasync = ServerConfig(policy="fedasync", concurrency=2, staleness="none")
    run = _written(dataclasses.replace(base, system=system, server=fedasync), tmp_path, "async", data)
    assert sync.run_dir is not None and run.run_dir is not None
    for d_run in (sync.run_dir, run.run_dir):
        clients = pd.read_csv(d_run / "clients.csv", keep_default_na=False)
        before, after = clients[clients["start_s"] < dip_at], clients[clients["start_s"] >= dip_at]
        assert len(before) and len(after)
        assert before["failure"].eq("").any() and before["failure"].isin(["", "memory_dip"]).all()  # fit at check-in
        assert after["failure"].eq("memory").all(), after[["client_id", "start_s", "failure"]]


def test_an_asynchronous_run_resumed_between_steps_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    """HeteroFL (sub-models, static BN, distillation state) under FedBuff with clients in flight whose trained
    uploads are held across the checkpoint: resumed from step 2, records and state bit for bit."""
    data = tiny_image_dataset()
    cfg = case("heterofl", data, rounds=5)
    cfg = dataclasses.replace(
        cfg, output_dir=str(tmp_path), server=ServerConfig(policy="fedbuff", concurrency=5, buffer_size=2)
    )
    full = run_experiment(cfg, dataset=data)
    assert full.run_dir is not None
    assert max(r.staleness_max for r in full.records) >= 1  # updates really arrived stale
    copy = tmp_path / "resumed"
    shutil.copytree(full.run_dir, copy)
    keep_checkpoints_up_to(copy, 2)
    resumed = run_experiment(cfg, dataset=data, resume=copy)
    assert_same_run(full.run_dir, copy, full, resumed)


def test_every_method_runs_under_fedbuff_and_overcommit(data: FederatedDataset) -> None:
    """No method branch: each registered method's tiny case runs two steps of each policy and learns something."""
    from tests.resume_cases import case_names

    for name in case_names():
        if name.startswith("fedoras"):  # phased: refused for asynchronous policies (validated below), sync only
            continue
        cfg = dataclasses.replace(case(name, data, rounds=2), checkpoint=CheckpointConfig(every=0))
        for server in (ServerConfig(policy="fedbuff", concurrency=5, buffer_size=2), ServerConfig(policy="overcommit")):
            result = run_experiment(dataclasses.replace(cfg, server=server), write=False, dataset=data)
            assert len(result.records) == 2 and all(r.clients_run > 0 for r in result.records), (name, server.policy)


def test_asynchronous_policies_refuse_what_they_cannot_run(tmp_path: Path) -> None:
    base = "rounds: 2\nclients_per_round: 4\ndata: {name: synthetic, num_clients: 8}\nmodel: {name: cnn}\n"
    path = tmp_path / "run.yaml"

    def load_config_text(text: str) -> ExperimentConfig:
        path.write_text(text)
        return load_config(path)

    bad = {
        "server: {policy: fedbuff}\nsystem: {compute_time: measured}\n": "server.policy",
        "server: {policy: fedasync, buffer_size: 2}\n": "server.buffer_size",
        "server: {policy: fedbuff, concurrency: 4, buffer_size: 5}\n": "server.buffer_size",
        "server: {policy: fedbuff, concurrency: 9}\n": "server.concurrency",
        "server: {policy: fedbuff}\neval_all_devices: true\n": "server.policy",
    }
    for text, key in bad.items():
        with pytest.raises(Exception, match=key.replace(".", r"\.")):
            load_config_text(base + text)
    assert load_config_text(base + "server: {policy: fedbuff}\n").server.policy == "fedbuff"
