"""``dataset = "correlated"``: synthetic records whose correlation is known in closed form.

The records of :func:`fedfdp.corrdp.correlated_features` (CorrDP paper's setting,
``docs/corrdp.md`` §7): ``num-sensitive`` sensitive columns ``s0, s1, ...`` (the
private columns of FDP, the sensitive ones of CorrDP) and ``num-insensitive``
insensitive columns ``u0, u1, ...`` (FDP's public columns), each a copy of a
sensitive sign with probability ``ρ = correlation``, so that ``TV(u_j) = ρ`` exactly;
``label-signal`` is how strongly the signs determine the label.
Every ``|x_k| ≤ 1/√m`` (declared as :attr:`~fedfdp.data.FederatedData.input_bound`),
a binary label. ``num-devices × records-per-device`` records drawn from
``data-seed`` (public randomness), split IID (or Dirichlet) over the devices, with
``test-fraction`` of every device held out. The public view of FDP masks the
sensitive columns with zeros (their mean).
"""

from __future__ import annotations

import dataclasses

from fedfdp.config import DataConfig
from fedfdp.corrdp.synthetic import correlated_features
from fedfdp.data.base import FederatedData
from fedfdp.data.split import assemble, data_rng, holdout_records, split_records
from fedfdp.features import FeatureSpec


def load_correlated(cfg: DataConfig) -> FederatedData:
    """The ``correlated`` dataset of ``cfg`` (module docstring).

    Examples
    --------
    >>> from fedfdp.config import DataConfig
    >>> data = load_correlated(DataConfig(dataset="correlated", num_devices=4, records_per_device=50,
    ...                                   num_sensitive=1, num_insensitive=3, correlation=0.5))
    >>> data.spec.private, data.spec.public, data.input_bound
    (('s0',), ('u0', 'u1', 'u2'), 0.5)
    """
    n = cfg.num_devices * cfg.records_per_device
    drawn = correlated_features(
        n, cfg.num_sensitive, cfg.num_insensitive, cfg.correlation, seed=cfg.data_seed,
        signal=cfg.label_signal,
    )
    device = split_records(drawn.y, cfg.num_devices, cfg.dirichlet_alpha, data_rng(cfg.data_seed, 2),
                           dataset="correlated")
    test = holdout_records(device, cfg.test_fraction, data_rng(cfg.data_seed, 1))
    names = drawn.names
    spec = FeatureSpec(
        columns=names,
        public=tuple(names[c] for c in drawn.insensitive),
        private=tuple(names[c] for c in drawn.sensitive),
    )
    data = assemble(
        "correlated", spec, drawn.x, drawn.y, device, test, tuple(str(k) for k in range(drawn.num_classes)),
        num_devices=cfg.num_devices, public_loss="zero",
    )
    return dataclasses.replace(data, input_bound=drawn.bound)
