"""Sweeps and jobs on the emulated multi-node cluster (issue 32; ``tests/emulated_cluster.py``): a head reserved for
the driver (0 CPUs) and two 1-CPU worker nodes, each with its own IP and its own ``/tmp``; ``shared_dir`` is mounted
into both, as NFS would be. One cluster serves the module (starting one is most of a test's time).

* The cluster itself: its nodes report distinct IPs to Ray, a worker's ``/tmp`` and working directory are its own,
  and the shared folder is the same on the head and both workers (its teardown leaves nothing: the fixture checks).
  What the workers need of this machine but lives under ``/tmp`` (a CI clone there, its virtual environment: issue
  46, where every worker failed with "exec: .../bin/ray: not found") stays visible to them at the same path.

* A two-trial sweep whose trials (1 CPU each) run on the two different worker nodes, its folder on the shared
  storage: checkpoints and results land there; the sweep's driver is SIGKILLed mid-run and ``rayfl sweep --resume``
  continues both trials from their checkpoints (their first rounds' rows, wall times included, are kept).
* The same sweep with its folder on the head's own disk (a pytest ``tmp_path``, which the workers do not see):
  refused in one line before any trial runs.
* A trial whose process is SIGKILLed is retried by Tune (``max_failures``) from its last checkpoint, and ends with
  the records of an uninterrupted run.
* ``ray job submit --working-dir`` of ``rayfl run`` with a relative ``output_dir``: the run says where it writes, and
  its results are outside the job's working directory, where they survive the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from rayfl.engine.driver import run_experiment
from rayfl.experiment.loader import load_config
from tests.emulated_cluster import (
    NODE_TMP,
    NODE_WORK,
    EmulatedCluster,
    emulated_cluster,
    leftovers,
    unavailable,
)
from tests.local_cluster import BIN
from tests.resume_cases import assert_same_run

# with pytest -n, one worker runs every multi-node test one after another (each starts several raylets)
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("cluster")]

BASE: dict[str, Any] = {
    "name": "tiny",
    "rounds": 30,  # ~0.5 s a round when the box is idle: long enough to be cut mid-run
    "clients_per_round": 4,
    "eval_every": 2,
    "data": {"name": "synthetic", "partition": "iid", "num_clients": 8, "synthetic_samples": 16},
    "train": {"lr": 0.05, "batch_size": 8, "eval_batch_size": 250},
    "model": {"name": "cnn", "channels": [4, 8]},
    "backend": {"kind": "ray", "num_hosts": 1, "torch_threads": 1},
    "checkpoint": {"every": 2},
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmulatedCluster]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    # a folder of this machine's under its temp folder, standing in for a checkout there (the case of issue 46)
    machine = Path(tempfile.mkdtemp(prefix="rfmachine_", dir=NODE_TMP))
    (machine / "bin").mkdir()
    (machine / "bin" / "tool").write_text("#!/bin/sh\necho tool ran\n")
    (machine / "bin" / "tool").chmod(0o755)
    try:
        with emulated_cluster(workers=2, worker_cpus=1, head_cpus=0, dashboard=True, visible=[machine]) as running:
            yield running
        assert leftovers(running) == []
        assert (machine / "bin" / "tool").exists()  # the workers' binds never reach the machine's own folder
    finally:
        shutil.rmtree(machine, ignore_errors=True)


NODE_IPS = (
    "import ray, sys\n"
    "ray.init(address=sys.argv[1], log_to_driver=False)\n"
    "print('IPS', *sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))\n"
)


def test_nodes_have_their_own_address_and_disk(cluster: EmulatedCluster) -> None:
    out = subprocess.run(
        [sys.executable, "-c", NODE_IPS, cluster.address],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    ips = next(line for line in out.stdout.splitlines() if line.startswith("IPS")).split()[1:]
    assert sorted(ips) == sorted([cluster.head_ip, *(w.ip for w in cluster.workers)])
    assert len(set(ips)) == 3

    wrote = cluster.run_on(
        0, ["sh", "-c", f"echo w0 > {NODE_TMP}/marker && echo shared > {cluster.shared_dir}/from_w0"]
    )
    assert wrote.returncode == 0, wrote.stderr
    assert (cluster.workers[0].private_tmp / "marker").read_text() == "w0\n"  # the node's own /tmp
    assert (cluster.shared_dir / "from_w0").read_text() == "shared\n"  # seen by the head
    other = cluster.run_on(1, ["sh", "-c", f"test -e {NODE_TMP}/marker; echo $?; cat {cluster.shared_dir}/from_w0"])
    assert other.stdout.split() == ["1", "shared"], other.stderr  # not w0's /tmp, but the same shared folder
    where = cluster.run_on(1, ["pwd"])
    assert where.stdout.strip() == str(NODE_WORK)
    (cluster.shared_dir / "from_w0").unlink()


def test_workers_see_this_machines_paths_under_tmp_and_its_python_wherever_it_lives(cluster: EmulatedCluster) -> None:
    # a folder of this machine's under /tmp, named visible: the same files at the same path on every worker, while
    # the rest of the worker's /tmp stays its own
    (machine,) = cluster.visible
    assert machine.is_relative_to(NODE_TMP)
    for worker in range(len(cluster.workers)):
        ran = cluster.run_on(worker, [str(machine / "bin" / "tool")])
        assert (ran.returncode, ran.stdout) == (0, "tool ran\n"), ran.stderr
    # this process's Python, rayfl and ray, whether or not the checkout lies under /tmp (CI clones may)
    probe = "import sys, rayfl, ray; print(sys.prefix, rayfl.__file__)"
    ran = cluster.run_on(0, [sys.executable, "-c", probe])
    assert ran.returncode == 0, ran.stderr[-2000:]
    import rayfl

    assert ran.stdout.split() == [sys.prefix, rayfl.__file__]


def _sweep_file(where: Path, cluster: EmulatedCluster, output_dir: Path, seeds: list[int] | None = None) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    sweep = {
        "base": {**BASE, "backend": {**BASE["backend"], "address": cluster.address}},
        "param_space": {"seed": seeds or [0, 1]},
        "output_dir": str(output_dir),
        # one trial per 1-CPU worker node: a trial reserves its driver's half CPU and its host's half
        "trial_resources": {"driver_cpus": 0.5, "cpus_per_host": 0.5},
    }
    path = where / "sweep.yaml"
    path.write_text(f"# rayfl sweep {path}\n" + yaml.safe_dump(sweep, sort_keys=False))
    return path


def _env(cluster: EmulatedCluster) -> dict[str, str]:
    # Tune saves its experiment state every second, so that a SIGKILLed driver leaves its trials' checkpoints known
    return {**cluster.env, "OMP_NUM_THREADS": "1", "TUNE_GLOBAL_CHECKPOINT_S": "1"}


def _sweep(argv: list[str], cluster: EmulatedCluster) -> None:
    """Run a sweep command on the emulated cluster to its end; a failure shows the end of its output and the end of
    each errored trial's error file (on the head's disk, named in Tune's output)."""
    done = subprocess.run(argv, capture_output=True, text=True, env=_env(cluster), timeout=420, check=False)
    if done.returncode != 0:
        errors = ""
        for name in sorted(set(re.findall(r"Error file: (\S+)", done.stdout + done.stderr))):
            with contextlib.suppress(OSError):
                errors += f"\n--- {name}:\n{Path(name).read_text(errors='replace')[-2000:]}"
        raise AssertionError(done.stdout[-3000:] + done.stderr[-3000:] + errors)


def _wait_for(pattern: str, root: Path, proc: subprocess.Popen[str], count: int, timeout_s: float = 300) -> None:
    """Until ``count`` distinct trials' folders (``root/sweep/tune/<trial>``) match ``pattern`` under them."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if len({p.relative_to(root).parts[2] for p in root.glob(f"sweep/tune/*/{pattern}")}) >= count:
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the sweep ended before it was killed:\n{out[-3000:]}\n{err[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"fewer than {count} trials with {pattern} under {root} after {timeout_s} s")


def _trial_pids(cluster: EmulatedCluster) -> list[int]:
    """The trials' processes (Tune's function actors) alive on the workers."""
    found = []
    for worker in cluster.workers:  # found in each worker node's namespace
        for pid in worker.pids():
            with contextlib.suppress(OSError):
                if "ImplicitFunc" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                    found.append(pid)
    return found


def _kill_driver(proc: subprocess.Popen[str], cluster: EmulatedCluster, timeout_s: float = 60) -> None:
    """SIGKILL the sweep's driver and its trials' processes with it. Ray ends the actors of a dead driver itself, but
    not at once: here a trial was seen still pruning its checkpoints while the test read its run directory back, which
    neither the test nor a resume may read half-way."""
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    began = time.monotonic()
    while (left := _trial_pids(cluster)) and time.monotonic() - began < timeout_s:
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    assert not left, f"trial processes {left} still alive {timeout_s} s after their driver was killed"


def _node_ips(trial_dir: Path) -> set[str]:
    lines = (trial_dir / "result.json").read_text().splitlines()
    return {json.loads(line)["node_ip"] for line in lines if line.strip()}


# first: a head that has served sweeps (SIGKILLed drivers, killed trials) was seen to time out the job agent's
# submissions for minutes; a fresh cluster's head answers at once. (Submissions that failed with "No available agent"
# for minutes under pytest -n 2 came from the agent's default port being held by another test's Ray: the fixture now
# gives the head's agent a free port.)
def test_a_ray_job_writes_its_results_where_they_outlive_the_job(cluster: EmulatedCluster, tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    experiment = {**BASE, "name": "job-run", "rounds": 2, "output_dir": "runs"}  # relative, as by default
    (job_dir / "exp.yaml").write_text(yaml.safe_dump(experiment))
    results_root = tmp_path / "kept"
    runtime_env = {"env_vars": {"RAYFL_OUTPUT_ROOT": str(results_root), "OMP_NUM_THREADS": "1"}}
    argv = [
        str(BIN / "ray"),
        "job",
        "submit",
        f"--address={cluster.dashboard}",
        f"--working-dir={job_dir}",
        f"--runtime-env-json={json.dumps(runtime_env)}",
        "--",
        sys.executable,
        "-m",
        "rayfl.cli",
        "run",
        "exp.yaml",
    ]
    deadline = time.monotonic() + 180
    while True:  # the head's dashboard agent registers some seconds after the node is up
        submit = subprocess.run(argv, capture_output=True, text=True, env=cluster.env, timeout=300, check=False)
        if "No available agent" not in submit.stderr or time.monotonic() > deadline:
            break
        time.sleep(2.0)
    log = submit.stdout + submit.stderr
    assert submit.returncode == 0, log[-4000:]
    assert f"output_dir 'runs' resolved against $RAYFL_OUTPUT_ROOT, to {results_root / 'runs'}" in log
    (run_dir,) = list((results_root / "runs").iterdir())
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert list(rounds["round_idx"]) == [0, 1]
    # the job's working directory is a copy under the head's Ray session folder, deleted with it; the run is not there
    assert "runtime_resources" not in str(run_dir.resolve())
    assert not list(Path(cluster.root, "head").glob("session_*/runtime_resources/working_dir_files/*/runs"))
    assert os.access(run_dir / "report.md", os.R_OK)


def test_a_sweep_on_shared_storage_runs_on_both_workers_and_resumes_after_the_driver_dies(
    cluster: EmulatedCluster,
) -> None:
    out = cluster.shared_dir / "sweeps"
    path = _sweep_file(cluster.shared_dir, cluster, out)
    command = [sys.executable, "-m", "rayfl.cli", "sweep"]
    proc = subprocess.Popen(
        [*command, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(cluster)
    )
    try:
        # both trials have reported a second checkpoint (round 4 or later) to Tune, in the shared folder (Tune keeps
        # the last two, so the first may be gone already)
        _wait_for("checkpoint_00000[1-9]/rayfl.json", out, proc, count=2)
        time.sleep(1.5)  # past Tune's next save: the trials' result.json (their nodes' IPs) on the shared folder
    finally:
        _kill_driver(proc, cluster)  # the driver dies; Ray ends its trials with it
    sweep_dir = out / "sweep"
    trials = sorted((sweep_dir / "trials").iterdir())
    assert len(trials) == 2
    heads = {t.name: (t / "rounds.csv").read_text().splitlines()[:3] for t in trials}  # header, rounds 0-1
    first_nodes = set().union(*(_node_ips(t) for t in (sweep_dir / "tune").glob("0000*") if t.is_dir()))
    done = [len(pd.read_csv(t / "rounds.csv")) for t in trials]
    assert min(done) < BASE["rounds"], done  # a trial was cut mid-run (both, unless one was far ahead)

    _sweep([*command, "--resume", str(sweep_dir)], cluster)
    table = pd.read_csv(sweep_dir / "results.csv")
    assert list(table["status"]) == ["completed", "completed"]
    assert list(table["figures_from"]) == ["run_dir", "run_dir"]
    assert table["test_acc"].notna().all()
    for trial in trials:
        rounds = pd.read_csv(trial / "rounds.csv")
        assert list(rounds["round_idx"]) == list(range(BASE["rounds"]))
        assert (trial / "rounds.csv").read_text().splitlines()[:3] == heads[trial.name]  # continued, not restarted
    tune_trials = sorted(p for p in (sweep_dir / "tune").iterdir() if p.is_dir() and p.name.startswith("0000"))
    assert len(tune_trials) == 2 and all(list(t.glob("checkpoint_*/rayfl.json")) for t in tune_trials)
    workers = {w.ip for w in cluster.workers}
    assert first_nodes == workers, first_nodes  # before the kill, the two trials ran on the two workers
    after = set().union(*(_node_ips(t) for t in tune_trials))
    assert after <= workers, after  # resumed wherever a worker had room; never on the head (it has no CPU)


def test_a_sweep_on_the_heads_own_disk_is_refused_before_any_trial_runs(
    cluster: EmulatedCluster, tmp_path: Path
) -> None:
    out = tmp_path / "sweeps"  # under the head's /tmp: the workers' /tmp is their own
    path = _sweep_file(tmp_path, cluster, out)
    run = subprocess.run(
        [sys.executable, "-m", "rayfl.cli", "sweep", str(path)],
        capture_output=True,
        text=True,
        env=_env(cluster),
        timeout=240,
        check=False,
    )
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("rayfl: error:")]
    assert len(errors) == 1, run.stderr[-3000:]
    line = errors[0]
    assert f"{out} is on this node's own disk" in line and "set output_dir to storage every node mounts" in line
    assert all(w.ip in line for w in cluster.workers)
    assert list(out.iterdir()) == []  # no sweep folder, no trial


def test_a_trial_whose_process_dies_is_retried_from_its_checkpoint(cluster: EmulatedCluster) -> None:
    """``max_failures`` (1 by default): the trial's process (Tune's function actor, on a worker) is SIGKILLed after
    its second checkpoint; Tune retries it from that checkpoint and the sweep ends with the records of an
    uninterrupted in-process run."""
    out = cluster.shared_dir / "retried"
    path = _sweep_file(cluster.shared_dir / "retry_sweep", cluster, out, seeds=[0])
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayfl.cli", "-v", "sweep", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(cluster),
    )
    killed: list[int] = []
    try:
        _wait_for("checkpoint_00000[1-9]/rayfl.json", out, proc, count=1)
        trial_dir = next((out / "sweep" / "trials").iterdir())
        head = (trial_dir / "rounds.csv").read_text().splitlines()[:3]
        for pid in _trial_pids(cluster):  # the trial's process
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        stdout, stderr = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert len(killed) == 1, killed
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    table = pd.read_csv(out / "sweep" / "results.csv")
    assert list(table["status"]) == ["completed"]
    assert (trial_dir / "rounds.csv").read_text().splitlines()[:3] == head  # continued from its checkpoint
    cfg = load_config(trial_dir / "config.yaml", ["backend.kind=local", f"output_dir={out / 'plain'}"])
    plain = run_experiment(cfg)
    assert plain.run_dir is not None
    assert_same_run(plain.run_dir, trial_dir)


LATER_CHECKPOINT = r"/checkpoint_00000[1-9]/rayfl\.json$"  # a trial's second reported checkpoint or later
# rounds as short as 0.1 s (CI's log): with 16, both trials were seen to have run them all by the time the test read
# their records back after killing the driver
S3_ROUNDS = 24


def test_a_sweep_on_s3_resumes_after_the_driver_dies_with_the_records_of_an_uninterrupted_sweep(
    cluster: EmulatedCluster, tmp_path: Path
) -> None:
    """Issue 45, item 3: the sweep's folder on an S3 emulator (moto's server on the head's bridge address, which the
    workers reach over the emulated network) and nothing on a shared mount: the sweep file and the driver's own
    folders are on the head's disk. The driver is SIGKILLed once both trials have reported a checkpoint to Tune
    there; ``rayfl sweep --resume s3://...`` continues both, and their records equal an uninterrupted sweep's."""
    from pyarrow import fs as pafs

    from rayfl.engine.persist.storage import download, open_storage
    from tests.s3_emulator import s3_emulator

    with s3_emulator(cluster.head_ip) as s3:
        s3.make_bucket("sweeps-bucket")
        out = s3.uri("sweeps-bucket", "sweeps")
        path = _sweep_file(tmp_path / "sweep_file", cluster, Path("unused"))
        sweep = yaml.safe_load(path.read_text())
        sweep["output_dir"] = out
        sweep["overrides"] = [f"rounds={S3_ROUNDS}"]
        path.write_text(f"# rayfl sweep {path}\n" + yaml.safe_dump(sweep, sort_keys=False))
        command = [sys.executable, "-m", "rayfl.cli", "sweep"]
        fs = s3.filesystem()
        proc = subprocess.Popen(
            [*command, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(cluster)
        )
        try:
            began = time.monotonic()
            while True:  # both trials have reported a checkpoint after round 4 or later to Tune, on the emulator
                found = fs.get_file_info(pafs.FileSelector("sweeps-bucket/sweeps/sweep/tune", True, True))
                reported = {i.path.split("/")[4] for i in found if re.search(LATER_CHECKPOINT, i.path)}
                if len(reported) >= 2:
                    break
                if proc.poll() is not None:
                    raise AssertionError(f"the sweep ended before it was killed:\n{proc.communicate()[1][-3000:]}")
                assert time.monotonic() - began < 300, "no checkpoints on the emulator after 300 s"
                time.sleep(0.5)
        finally:
            _kill_driver(proc, cluster)
        killed = tmp_path / "killed"
        download(open_storage(s3.uri("sweeps-bucket", "sweeps/sweep/trials")), killed)
        heads = {t.name: (t / "rounds.csv").read_text().splitlines()[:3] for t in killed.iterdir()}
        done = [len(pd.read_csv(t / "rounds.csv")) for t in killed.iterdir()]
        assert len(heads) == 2 and min(done) < S3_ROUNDS, done  # a trial was cut mid-run

        _sweep([*command, "--resume", s3.uri("sweeps-bucket", "sweeps/sweep")], cluster)
        _sweep([*command, str(path), "name=plain"], cluster)
        after, uninterrupted = tmp_path / "after", tmp_path / "plain"
        download(open_storage(s3.uri("sweeps-bucket", "sweeps/sweep")), after)
        download(open_storage(s3.uri("sweeps-bucket", "sweeps/plain")), uninterrupted)
    for folder in (after, uninterrupted):
        table = pd.read_csv(folder / "results.csv")
        assert list(table["status"]) == ["completed", "completed"]
        assert list(table["figures_from"]) == ["run_dir", "run_dir"]
    trials = sorted(p.name for p in (after / "trials").iterdir())
    assert trials == sorted(p.name for p in (uninterrupted / "trials").iterdir()) == sorted(heads)
    for name in trials:
        trial = after / "trials" / name
        assert list(pd.read_csv(trial / "rounds.csv")["round_idx"]) == list(range(S3_ROUNDS))
        assert (trial / "rounds.csv").read_text().splitlines()[:3] == heads[name]  # continued, not restarted
        assert_same_run(uninterrupted / "trials" / name, trial)
    tune_trials = [t for t in (after / "tune").iterdir() if t.is_dir() and t.name.startswith("0000")]
    workers = {w.ip for w in cluster.workers}
    assert len(tune_trials) == 2 and set().union(*(_node_ips(t) for t in tune_trials)) <= workers
