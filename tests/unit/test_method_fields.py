"""The experiment's rules read a method's width ratio lists and distillation section through their types (issue 43,
item 5): a list is checked because its config marks it (``width_ratios``), a distillation section because it is a
``DistillConfig``, whatever the method calls them; nothing is looked up by key."""

from __future__ import annotations

from dataclasses import fields

import pytest

from rayfl.config.fields import WIDTH_RATIOS
from rayfl.core.errors import ConfigError
from rayfl.experiment.loader import load_config
from rayfl.fl.registry import METHODS


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_width_list_is_marked(name: str) -> None:
    """The lists the rules checked by name before the marks (``ratios`` may hold 0, ``rates`` and ``widths`` not) are
    all marked, and nothing else is."""
    config = fields(METHODS[name].config)
    marked = {f.name: f.metadata[WIDTH_RATIOS] for f in config if WIDTH_RATIOS in f.metadata}
    named = {f.name: f.name == "ratios" for f in config if f.name in ("ratios", "rates", "widths")}
    assert marked == named


@pytest.mark.parametrize(
    ("overrides", "key_path", "fragment"),
    [
        (("algorithm.name=heterofl", "algorithm.rates=[0, 1]"), "algorithm.rates[0]", "must lie in (0, 1], got 0"),
        (("algorithm.name=fjord", "algorithm.widths=[0.5, 1.5]"), "algorithm.widths[1]", "must lie in (0, 1]"),
        (("algorithm.name=model_search", "algorithm.ratios=[-0.5, 1]"), "algorithm.ratios[0]", "must lie in [0, 1]"),
        (("algorithm.name=fedseq", "algorithm.ratios=[]"), "algorithm.ratios", "must list at least one value"),
        (("algorithm.name=fedrolex", "algorithm.distill.ratios=[2]"), "algorithm.distill.ratios[0]", "must lie in"),
        (("algorithm.name=anycostfl", "algorithm.distill.lr=1e39"), "algorithm.distill.lr", "float32's largest"),
    ],
)
def test_width_lists_and_distillation_are_checked(overrides: tuple[str, ...], key_path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, list(overrides))
    assert info.value.key_path == key_path and fragment in str(info.value)


def test_a_zero_ratio_passes_where_blocks_can_be_removed() -> None:
    cfg = load_config(None, ["algorithm.name=model_search", "algorithm.ratios=[0, 0.5, 1]"])
    assert cfg.algorithm.ratios == (0.0, 0.5, 1.0)
