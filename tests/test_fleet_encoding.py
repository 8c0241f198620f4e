"""The fleet's declared column encodings (:func:`fedfdp.data.fleet.column_scaling`).

The attribute attack places its heart-rate bins with the public encoding; these
tests check that encoding against the generative model's documented units
(bpm), not against the encoder itself.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedfdp.attack.runs import fleet_grid
from fedfdp.data.fleet import CLASSES, COLUMNS, column_scaling, make_fleet

#: Class means of the heart rate in the generative model (bpm): still, walk, run, bike, vehicle.
HEART_MEANS_BPM = {"still": 70.0, "walk": 92.0, "run": 150.0, "bike": 128.0, "vehicle": 74.0}


def test_decoded_heart_rate_is_in_bpm_per_class():
    """Records are ``N(μ_c + o_d, 12²)`` bpm with device offsets ``o_d ~ N(0, 5²)``: over
    300 devices the class means of the decoded column lie within 3 bpm of ``μ_c``
    (the standard error is below 0.7 bpm for every class: > 4 standard errors)."""
    data = make_fleet(300, 60, seed=11)
    x = np.concatenate([d.x for d in data.devices])
    y = np.concatenate([d.y for d in data.devices])
    bpm = column_scaling("heart_rate").decode(x[:, COLUMNS.index("heart_rate")])
    for c, name in enumerate(CLASSES):
        assert abs(bpm[y == c].mean() - HEART_MEANS_BPM[name]) < 3.0, name


def test_public_imputation_value_is_the_declared_resting_heart_rate():
    stats = make_fleet(2, 10).public_statistics
    assert stats is not None
    np.testing.assert_allclose(column_scaling("heart_rate").decode(stats.values[0]), 80.0, rtol=1e-12)


def test_attack_grid_bins_are_the_documented_bpm_edges():
    grid = fleet_grid()
    heart = column_scaling("heart_rate")
    np.testing.assert_allclose(heart.decode(grid.edges[0]), [80.0, 100.0, 120.0, 140.0], rtol=1e-12)
    np.testing.assert_allclose(heart.decode(grid.centres[0]), [70.0, 90.0, 110.0, 130.0, 155.0], rtol=1e-12)


def test_encode_and_decode_are_inverse_and_unknown_columns_are_named():
    values = np.array([-3.0, 0.0, 1.5, 250.0])
    for column in ("speed", "accel_mean", "accel_std", "heart_rate"):
        s = column_scaling(column)
        np.testing.assert_allclose(s.decode(s.encode(values)), values, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="column='latitude'"):
        column_scaling("latitude")
