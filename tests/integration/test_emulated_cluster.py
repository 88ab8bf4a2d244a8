"""The emulated cluster itself (``tests/emulated_cluster.py``): its nodes report distinct IPs to Ray, a worker's
``/tmp`` is its own, the shared folder is the same on the head and on the workers that mount it, and nothing of the
cluster outlives its teardown."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.emulated_cluster import NODE_TMP, NODE_WORK, emulated_cluster, leftovers, unavailable

# with pytest -n, one worker runs every multi-node test one after another (each starts several raylets)
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("cluster")]

NODE_IPS = (
    "import ray, sys\n"
    "ray.init(address=sys.argv[1], log_to_driver=False)\n"
    "print('IPS', *sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))\n"
)


def test_nodes_have_their_own_address_and_disk() -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with emulated_cluster(workers=2, shared_on=[0]) as cluster:
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
        other = cluster.run_on(
            1, ["sh", "-c", f"test -e {NODE_TMP}/marker; echo $?; test -e {cluster.shared_dir}; echo $?"]
        )
        assert other.stdout.split() == ["1", "1"], other.stderr  # neither w0's /tmp nor the unmounted share
        where = cluster.run_on(1, ["pwd"])
        assert where.stdout.strip() == str(NODE_WORK)
    assert leftovers(cluster) == []
