"""The centralised engine under ``aggregation = "secagg"``: the protocol's noise, not the protocol.

The engine adds to each private round's sum what the secure sum of ``n_min`` parties
carries (:func:`fedfdp.algorithm.secure_sum_noise`). References are independent of the
code under test: the discrete Gaussian's variance ``σ_loc²`` per share (so ``n_min·σ_loc²``
integer units, ``(C/s)²`` per unit), the plan's accounted ``σC`` as a floor, and the plain
engine at the same σ as the accuracy a noised run cannot beat by much.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from fedfdp.algorithm import SECAGG_NOTE, run_centralised, secure_sum_noise
from fedfdp.config import load_config
from fedfdp.secagg.plan import secagg_plan


def test_the_noise_is_that_of_n_min_discrete_gaussian_shares():
    sigma, clip, parties, d = 1.5, 1.0, 4, 400
    plan = secagg_plan(sigma, dimension=d, num_records=1000, max_parties=parties, min_survivors=parties,
                       colluders=0)
    x = torch.linspace(-3.0, 3.0, d)
    draws = np.concatenate([
        (secure_sum_noise([x], plan, clip)[0] - x).double().numpy() for _ in range(20)])
    # n_min shares of N_Z(0, σ_loc²) plus one rounding (variance ≤ 1/4 unit), in units of C/s
    unit = clip / plan.scale
    want = parties * plan.local_sigma**2 * unit**2
    rounding = 0.25 * unit**2
    var = float(np.mean(draws**2))
    n = draws.size
    # the sample variance of n normal draws has relative s.e. sqrt(2/n) (2.5 % here): 5 s.e.
    tol = 5 * math.sqrt(2 / n)
    assert want * (1 - tol) <= var <= (want + rounding) * (1 + tol), (var, want)
    assert abs(float(np.mean(draws))) <= 5 * math.sqrt(want / n)  # unbiased
    # at least the noise the accountant charges (σC for n_min − t_c honest shares)
    assert math.sqrt(var) >= sigma * clip * (1 - tol)


def test_a_centralised_secagg_run_is_noised_and_says_what_it_simulates(caplog):
    """A large σ must cost accuracy under secagg as under plain aggregation (before, the
    centralised engine released the noiseless sum under secagg)."""
    common = {"num-rounds": 8, "num-devices": 4, "records-per-device": 60, "progress": False,
              "learning-rate": 0.5}
    base = {**common, "noise-multiplier": 50.0, "clipping-quantile": 0}
    free = {**common, "mode": "nonprivate"}
    with caplog.at_level(logging.WARNING, logger="fedfdp"):
        _, secagg = run_centralised(load_config({**base, "aggregation": "secagg", "secagg-min-survivors": 4}))
    notes = [r.getMessage() for r in caplog.records if "centralised engine" in r.getMessage()]
    assert notes == [SECAGG_NOTE.format(parties=4)]
    _, nonprivate = run_centralised(load_config(free))
    assert secagg[-1]["accuracy"] < nonprivate[-1]["accuracy"] - 0.1
