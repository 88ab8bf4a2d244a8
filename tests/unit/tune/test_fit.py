"""A sweep's fit check (``rayfl/tune/fit.py``): bundles against node types, not cluster totals."""

from __future__ import annotations

from rayfl.tune.fit import NodeType, fit_problem

HEAD = NodeType({"CPU": 0.0}, 1)  # reserved for the driver and GCS
TWO_CPU = NodeType({"CPU": 2.0}, 4)


def test_a_bundle_larger_than_any_node_is_refused_though_the_totals_fit() -> None:
    problem = fit_problem([{"CPU": 0.5}, {"CPU": 4.0}], [HEAD, TWO_CPU], "PACK")
    assert problem is not None and problem.startswith("bundle 1 {CPU: 4} fits on no single node")
    assert "4 x {CPU: 2}" in problem


def test_bundles_that_each_fit_a_node_pass() -> None:
    assert fit_problem([{"CPU": 0.5}] + [{"CPU": 2.0}] * 3, [HEAD, TWO_CPU], "SPREAD") is None


def test_gpu_and_custom_resources_must_be_on_one_node_type() -> None:
    nodes = [NodeType({"CPU": 8.0}, 1), NodeType({"CPU": 8.0, "GPU": 1.0}, 2)]
    assert fit_problem([{"CPU": 1.0}, {"CPU": 2.0, "GPU": 0.5}], nodes, "PACK") is None
    assert fit_problem([{"CPU": 1.0, "GPU": 2.0}], nodes, "PACK") is not None
    assert fit_problem([{"CPU": 1.0, "rayfl_host": 1.0}], nodes, "PACK") is not None


def test_strict_strategies() -> None:
    bundles = [{"CPU": 1.0}] * 3
    problem = fit_problem(bundles, [TWO_CPU], "STRICT_PACK")
    assert problem is not None and "STRICT_PACK" in problem
    assert fit_problem(bundles, [NodeType({"CPU": 2.0}, 2)], "STRICT_SPREAD") is not None
    assert fit_problem(bundles, [NodeType({"CPU": 2.0}, 3)], "STRICT_SPREAD") is None


def test_totals_beyond_the_cluster_are_refused_unless_an_autoscaler_can_launch_them() -> None:
    bundles = [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}]
    alive = [NodeType({"CPU": 4.0}, 1), NodeType({"CPU": 8.0, "GPU": 1.0}, 2)]
    problem = fit_problem(bundles, alive, "PACK")
    assert problem is not None and "3 GPU in all" in problem
    launchable = NodeType({"CPU": 8.0, "GPU": 1.0}, 4, name="gpu_worker", launchable=True)
    assert fit_problem(bundles, [*alive, launchable], "PACK") is None
    # a GPU bundle with no GPU node up yet: the autoscaler's node type serves it
    assert fit_problem(bundles, [NodeType({"CPU": 4.0}, 1), launchable], "PACK") is None
    unbounded = NodeType({"CPU": 8.0, "GPU": 1.0}, -1, launchable=True)
    assert fit_problem(bundles * 10, [NodeType({"CPU": 4.0}, 1), unbounded], "PACK") is None


def test_the_launchers_worker_types_count_as_launchable() -> None:
    from pathlib import Path

    from rayfl.tune.cluster import launcher_node_types

    text = (Path(__file__).resolve().parents[3] / "cluster.yaml").read_text()
    (gpu,) = launcher_node_types(text)  # the head type is among the alive nodes, not launchable
    assert (gpu.name, gpu.resources, gpu.count, gpu.launchable) == ("gpu_worker", {"CPU": 8.0, "GPU": 1.0}, 4, True)
    head_only = [NodeType({}, 1)]  # only the head is up (CPU 0), no GPU worker yet
    bundles = [{"CPU": 0.25}, {"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}]
    assert fit_problem(bundles, head_only, "PACK") is not None
    assert fit_problem(bundles, [*head_only, gpu], "PACK") is None
    assert launcher_node_types("not: [a, mapping") == [] and launcher_node_types("cluster_name: x") == []
