"""Data where it is used (issue 45, item 2) on the emulated cluster (``tests/emulated_cluster.py``): a head reserved
for the driver (0 CPUs) and two 1-CPU worker nodes, an on-disk data set of 48 MiB on the storage both workers mount.

Through the object store (``data.ship: object_store``, what every run did before) the head's store holds the data set
and each worker's a copy of all of it, though each worker's host trains only some clients. Shipped by path
(``data.ship: auto``, which finds that every node sees the files), no node's store holds more than a few MiB: each
host maps the files on its own node. Both runs' records equal the in-process run's. With the files on the head's own
disk, ``data.ship: path`` refuses the run in one line naming the node that cannot read them.

On one node (a local Ray), ``data.ship: path`` trains on maps opened again by the hosts, with the in-process records.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rayfl.data.federated import IndexedRows
from rayfl.engine.build import prepare_run
from rayfl.engine.driver import run_experiment
from rayfl.experiment.loader import load_config
from tests.emulated_cluster import EmulatedCluster, emulated_cluster, leftovers, unavailable
from tests.local_cluster import BIN
from tests.object_store_bytes import make_on_disk_data, on_disk_experiment, read_peaks, watch_object_stores
from tests.resume_cases import assert_same_run

# with pytest -n, one worker runs every multi-node test one after another (each starts several raylets)
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("cluster")]

RUN_TIMEOUT_S = 300
CLIENTS, ROWS_PER_CLIENT = 8, 2048  # 8 x 2048 images of 3 x 32 x 32 bytes: 48 MiB


def _run(cluster: EmulatedCluster, config: Path, out: Path, ship: str) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "rayfl"), "-v", "run", str(config), f"backend.address={cluster.address}", f"output_dir={out}"]
    return subprocess.run(
        [*argv, f"data.ship={ship}"], env=cluster.env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        check=False,
    )  # fmt: skip


def _run_dir(out: Path) -> Path:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def test_mapped_data_goes_by_path_and_no_object_store_holds_it(tmp_path: Path) -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with emulated_cluster(workers=2, worker_cpus=1, head_cpus=0) as cluster:
        data = make_on_disk_data(cluster.shared_dir / "data", CLIENTS, ROWS_PER_CLIENT)
        data_bytes = Path(data["x"]).stat().st_size
        config = on_disk_experiment(tmp_path / "experiment.yaml", data)
        want = run_experiment(load_config(config, ["backend.kind=local", f"output_dir={tmp_path / 'local'}"]))
        assert want.run_dir is not None
        peaks: dict[str, dict[str, int]] = {}
        for ship in ("object_store", "auto"):
            with watch_object_stores(cluster.address, cluster.env, tmp_path / f"{ship}.json") as watched:
                run = _run(cluster, config, tmp_path / ship, ship)
            assert run.returncode == 0, run.stderr[-4000:]
            peaks[ship] = read_peaks(watched)
            assert_same_run(_run_dir(tmp_path / ship), want.run_dir)
            assert ("shipped by path" in run.stderr) == (ship == "auto"), run.stderr[-4000:]
        print(f"\nobject-store peak bytes per node, data set {data_bytes} bytes: {peaks}")
        nodes = [cluster.head_ip, *(w.ip for w in cluster.workers)]
        assert sorted(peaks["auto"]) == sorted(nodes), peaks
        # before: the head's store and each worker's hold the whole set (the measurement sees it)
        assert all(peaks["object_store"][node] >= data_bytes for node in nodes), peaks
        # after: no store holds as much as one client's images (data_bytes / CLIENTS)
        assert all(peak < data_bytes // CLIENTS for peak in peaks["auto"].values()), peaks

        head_only = make_on_disk_data(tmp_path / "head-disk", 2, 16)  # the head's /tmp: the workers do not see it
        refused = _run(cluster, on_disk_experiment(tmp_path / "head.yaml", head_only), tmp_path / "refused", "path")
        assert refused.returncode == 2, refused.stderr[-4000:]
        (line,) = [x for x in refused.stderr.splitlines() if x.startswith("rayfl: error:")]
        assert "data.ship: the data set's files cannot be mapped on every node" in line, line
        assert all(f"Ray node {w.ip}: {head_only['x']} cannot be read" in line for w in cluster.workers), line
    assert leftovers(cluster) == []


@pytest.mark.usefixtures("ray_local")
def test_on_one_node_mapped_data_by_path_gives_the_in_process_records(tmp_path: Path) -> None:
    data = make_on_disk_data(tmp_path / "data", 4, 32, num_test=20)
    config = on_disk_experiment(tmp_path / "experiment.yaml", data, rounds=2)
    setup = prepare_run(load_config(config, ["data.ship=path"]))
    try:
        assert isinstance(setup.dataset.x, IndexedRows) and setup.dataset.x.by_path  # the store's copy: a path
    finally:
        setup.pool.release()
    ray, local = (
        run_experiment(load_config(config, [f"backend.kind={kind}", "data.ship=path"]), write=False)
        for kind in ("ray", "local")
    )
    assert [r.train_loss for r in ray.records] == [r.train_loss for r in local.records]
    assert [(r.test_acc, r.test_loss) for r in ray.records] == [(r.test_acc, r.test_loss) for r in local.records]
    for name, tensor in ray.state.params.items():
        assert bool((tensor == local.state.params[name]).all()), name
