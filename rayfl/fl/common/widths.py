"""Width sets that several methods share as defaults (constants only, so that method configs import no torch)."""

from __future__ import annotations

__all__ = ["CAPACITIES", "COLUMN_RATIOS", "HETEROFL_RATES"]


# ------------------------------------------------------------------------------------------------ algorithms
HETEROFL_RATES = (1.0, 0.5, 0.25, 0.125, 0.0625)  # HeteroFL's model levels a-e


COLUMN_RATIOS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)  # columns of 1/8 of the network (paper 004)


CAPACITIES = (0.25, 0.5, 0.75, 1.0)  # paper 004's cluster capacities P_c
