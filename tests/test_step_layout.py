"""The FDP step's views are what a plain reading of their definition gives.

The client step builds its views with a gather chosen for speed
(``benchmarks/step.py``); this property pins what it computes against the plain
definition: a Gaussian view is ``x`` with its private columns overwritten, column
assignment by column assignment, by the generator's draws of shape ``(rows, private)``
in the order the spec lists the private columns.
"""

from __future__ import annotations

import numpy as np
import torch

from fedfdp.features import FeatureSpec, PublicView


def _reference_view(spec: FeatureSpec, x: torch.Tensor, seed: int) -> torch.Tensor:
    noise = torch.randn((x.shape[0], len(spec.private)), generator=torch.Generator().manual_seed(seed),
                        dtype=x.dtype)
    out = x.clone()
    for k, column in enumerate(spec.private):
        out[:, spec.columns.index(column)] = noise[:, k]
    return out


def test_a_gaussian_view_is_x_with_its_private_columns_assigned_the_draws_in_order():
    rng = np.random.default_rng(3)
    for trial in range(60):
        n = int(rng.integers(2, 30))
        cols = tuple(f"c{i}" for i in range(n))
        public = set(rng.choice(n, int(rng.integers(1, n)), replace=False).tolist())
        private = [cols[i] for i in range(n) if i not in public]
        rng.shuffle(private)  # any order of the private list
        spec = FeatureSpec(cols, tuple(cols[i] for i in sorted(public)), tuple(private))
        dtype = torch.float64 if trial % 2 else torch.float32
        x = torch.as_tensor(rng.normal(size=(int(rng.integers(0, 12)), n))).to(dtype)
        before = x.clone()
        got = PublicView(spec, "gaussian")(x, torch.Generator().manual_seed(trial))
        assert got.dtype == x.dtype and torch.equal(got, _reference_view(spec, x, trial))
        assert torch.equal(x, before)  # the input is left as it was

