"""FEMNIST's shapes without its data, for search-only studies (``data.name: custom``).

Paper 000's Figure 10 set-up (Appendix E.1) is setting 5: FEMNIST's 3597 writers, 1x28x28 images, 62 classes. A
search-only run never trains, so what matters is the input shape and class count (they fix the ViT's sequence length,
its classifier and so every structure's memory and bytes) and the number of clients; the images themselves are never
read. LEAF's FEMNIST cannot be downloaded here, so this factory gives ``num_clients`` natural clients of
``per_client`` blank images each (FEMNIST's writers hold 226.8 on average; the count only changes the modelled
compute time, never a budget or a fit) and a small test set.
"""

from __future__ import annotations

import numpy as np

from rayfl.data import FederatedDataset, from_client_arrays

NUM_CLASSES = 62


def clients(num_clients: int, per_client: int = 8) -> FederatedDataset:
    """``num_clients`` clients of ``per_client`` blank 1x28x28 images labelled round-robin over 62 classes."""
    labels = np.arange(per_client, dtype=np.int64) % NUM_CLASSES
    image = np.zeros((per_client, 1, 28, 28), dtype=np.uint8)
    train = [(image, labels) for _ in range(num_clients)]
    x_test = np.zeros((NUM_CLASSES, 1, 28, 28), dtype=np.uint8)
    y_test = np.arange(NUM_CLASSES, dtype=np.int64)
    return from_client_arrays(
        "femnist-shape", "image", NUM_CLASSES, train, x_test, y_test, meta={"mean": [0.5], "std": [0.25]}
    )
