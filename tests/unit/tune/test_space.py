"""Swept parameters: grid expansion, the points checked up front, trial overrides and labels."""

from __future__ import annotations

import numpy as np

from rayfl.tune.space import Param, grid_points, plain, point_label, trial_overrides, validation_points


def test_grid_expansion_is_the_cross_product_first_key_slowest() -> None:
    params = [
        Param("algorithm.epsilon", "grid", values=(0.2, 0.4, 0.6, 0.8, 1.0)),
        Param("algorithm.t_max", "grid", values=(1, 3, 5, 10)),
    ]
    points = grid_points(params)
    assert len(points) == 20
    assert points[:5] == [{"algorithm.epsilon": 0.2, "algorithm.t_max": t} for t in (1, 3, 5, 10)] + [
        {"algorithm.epsilon": 0.4, "algorithm.t_max": 1}
    ]
    assert len({tuple(p.items()) for p in points}) == 20
    assert grid_points([]) == [{}]


def test_validation_points_cover_every_grid_point_and_every_candidate_of_drawn_values() -> None:
    params = [
        Param("seed", "grid", values=(0, 1)),
        Param("algorithm.epsilon", "uniform", low=0.1, high=0.9),
        Param("algorithm.t_max", "randint", low=1, high=10),
        Param("algorithm.criterion", "choice", values=("params", "memory")),
    ]
    points = validation_points(params)
    assert points[0] == {"seed": 0, "algorithm.epsilon": 0.1, "algorithm.t_max": 1, "algorithm.criterion": "params"}
    assert points[1]["seed"] == 1
    assert {p["algorithm.epsilon"] for p in points} == {0.1, 0.9}
    assert {p["algorithm.t_max"] for p in points} == {1, 9}  # randint's upper end is excluded
    assert {p["algorithm.criterion"] for p in points} == {"params", "memory"}
    assert len(points) == 2 + 1 + 1 + 1


def test_trial_overrides_put_variant_names_first_and_write_json() -> None:
    point = {"algorithm.epsilon": np.float64(0.25), "algorithm.name": "model_search", "algorithm.ratios": (0, 0.5, 1)}
    assert trial_overrides(point) == [
        'algorithm.name="model_search"',
        "algorithm.epsilon=0.25",
        "algorithm.ratios=[0, 0.5, 1]",
    ]
    assert plain(np.int64(3)) == 3 and type(plain(np.int64(3))) is int


def test_point_labels_are_short_and_file_name_safe() -> None:
    assert point_label({"algorithm.epsilon": 0.2, "algorithm.t_max": 5}) == "epsilon=0.2,t_max=5"
    assert point_label({"algorithm.ratios": [0, 0.5], "x.name": "a/b c"}) == "ratios=0,0.5,name=abc"
    assert len(point_label({"seed": 1, "data.root": "x" * 200})) == 80
    assert point_label({}) == "trial"
