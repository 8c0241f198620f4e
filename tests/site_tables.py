"""A raw user table in physical units and the declarations that encode it, for the
node-local data tests (tests/test_node_data.py, tests/test_deploy.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

CLASSES = ("bike", "run", "walk")
PHONES = ("p-anna", "p-ben", "p-cem")


def trips(n: int = 240, seed: int = 0) -> pd.DataFrame:
    """A raw table in physical units: public speed/heading/weather, private heart
    rate/location/city, the activity label, and the phone (the site)."""
    rng = np.random.default_rng(seed)
    act = rng.integers(0, 3, n)
    return pd.DataFrame(
        {
            "phone": rng.choice(PHONES, n),
            "speed": np.array([4.5, 3.0, 1.4])[act] + rng.normal(0, 0.8, n),
            "heading": rng.uniform(0, 360, n),
            "weather": rng.choice(["sun", "rain", "fog"], n),
            "heart_rate": np.array([120.0, 150.0, 90.0])[act] + rng.normal(0, 12, n),
            "lat": rng.normal(0.1 * act, 0.3, n),
            "lon": rng.normal(-0.1 * act, 0.3, n),
            "city": rng.choice(["A", "B", "C"], n),
            "activity": np.array(CLASSES)[act],
        }
    )


DECLARED = {
    "dataset": "csv",
    "public-columns": "speed,heading,weather",
    "private-columns": "heart_rate,lat,lon,city",
    "label-column": "activity",
    "label-classes": "|".join(CLASSES),
    "public-ranges": "speed=0:10,heading=0:360",
    "public-categories": "weather=sun|rain|fog",
    "private-ranges": "heart_rate=40:200,lat=-1:1,lon=-1:1",
    "private-categories": "city=A|B|C",
}
