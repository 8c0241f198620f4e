"""The secure-aggregation part of a resolved mechanism: ``σ_loc``, ``s``, ``n_min``, ``t_c``.

:func:`secagg_plan` turns the configuration's ``secagg-*`` keys, the accounted noise
multiplier ``σ`` and the run's public facts (``N``, ``d``, the number of devices) into
a frozen :class:`SecAggPlan`, and :func:`secagg_event` gives the event one round is
charged: :class:`~fedfdp.accounting.distributed.DistributedDiscreteGaussian` for
``n_h = n_min − t_c`` honest parties (``docs/secagg_accounting.md`` §5: ``σ_eff`` grows
with ``n_h``, so this event dominates every round that unmasks; a round with fewer
than ``n_min`` survivors aborts before unmasking and is not charged).

Each party's discrete Gaussian has std

``σ_loc = √((σ² Δ² + t²) / n_h)``, ``Δ = s + √d`` (add/remove sensitivity of the
rounded sum in integer units, one record clipped to ``C`` scaled to ``s``),

so that the smoothed round's Gaussian noise multiplier
``σ_eff = √(n_h σ_loc² − t²)/Δ`` equals ``σ`` (Lemma 2's smoothing ``t``). The scale
``s`` is ``secagg-scale`` or :func:`fedfdp.secagg.encoding.choose_scale` over public
bounds: ``N`` records and at most ``num-devices`` parties (every SuperNode serves at
least one device).

Calibration to a target ε: ``σ ↦ secagg_event(secagg_plan(σ, …), q)`` is the event
family the one calibrator (:func:`fedfdp.accounting.protocol.calibrate`) searches over
the distributed accountant, so route A's slack (``2Λ``, ``δe^{−Λ}``) is part of what
is calibrated; below the ``σ`` at which ``σ_loc`` reaches ``MIN_LOCAL_SIGMA`` the
family has no event (:class:`~fedfdp.accounting.protocol.NoEvent`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedfdp.accounting.discrete_gaussian_bounds import MIN_LOCAL_SIGMA, SMOOTHING, sensitivity
from fedfdp.accounting.distributed import honest_parties
from fedfdp.accounting.events import DistributedDiscreteGaussian
from fedfdp.accounting.protocol import NoEvent
from fedfdp.secagg.encoding import HALF, choose_scale, headroom

__all__ = ["SecAggPlan", "local_sigma_for", "secagg_event", "secagg_plan"]


def local_sigma_for(noise_multiplier: float, scale: float, dimension: int, honest: int,
                    smoothing: float = SMOOTHING) -> float:
    """``σ_loc = √((σ²Δ² + t²)/n_h)``: the local std at which ``σ_eff = σ`` exactly."""
    delta = sensitivity(scale, dimension)
    return math.sqrt((noise_multiplier**2 * delta**2 + smoothing**2) / honest)


@dataclass(frozen=True)
class SecAggPlan:
    """What every party of a secure-aggregation run uses, fixed at resolution.

    Attributes
    ----------
    local_sigma : float
        ``σ_loc``: each party's discrete Gaussian std, integer units.
    scale : float
        ``s``: integer units per clipping norm ``C``.
    dimension : int
        ``d``: the coordinates aggregated (the model's trainable parameters).
    min_survivors : int
        ``n_min``: below it a round aborts.
    colluders : int
        ``t_c``: the declared colluders.
    neighbours : int or None
        ``k`` (None: the protocol's default for the round's party count).
    threshold : int or None
        ``t`` (None: ``⌊k/2⌋ + 1``).
    max_parties : int
        The public bound on the parties the headroom check was made for.
    """

    local_sigma: float
    scale: float
    dimension: int
    min_survivors: int
    colluders: int
    neighbours: int | None
    threshold: int | None
    max_parties: int

    @property
    def honest_parties(self) -> int:
        """``n_h = n_min − t_c``: the honest noises every charged round has at least."""
        return honest_parties(self.min_survivors, self.colluders)

    def to_dict(self) -> dict[str, Any]:
        return {
            "local_sigma": self.local_sigma, "scale": self.scale, "dimension": self.dimension,
            "min_survivors": self.min_survivors, "colluders": self.colluders,
            "neighbours": self.neighbours, "threshold": self.threshold, "max_parties": self.max_parties,
        }


def secagg_plan(
    noise_multiplier: float,
    *,
    dimension: int,
    num_records: int,
    max_parties: int,
    min_survivors: int,
    colluders: int,
    neighbours: int | None = None,
    threshold: int | None = None,
    scale: float | None = None,
) -> SecAggPlan:
    """The plan for accounted noise multiplier ``σ`` (module docstring).

    Raises
    ------
    ValueError
        One line naming the value: more survivors required than parties can exist, or
        a failed headroom check (no scale keeps the aggregate within ±2³¹).
    NoEvent
        ``σ_loc < MIN_LOCAL_SIGMA`` (a :class:`ValueError` too): σ is too small for the
        distributed discrete Gaussian to be accounted at this scale, so the family
        ``σ ↦ secagg_event(secagg_plan(σ, …), q)`` has no event there
        (:func:`fedfdp.accounting.protocol.calibrate` searches above it).
    """
    if min_survivors > max_parties:
        raise ValueError(
            f"secagg-min-survivors={min_survivors}: more than the {max_parties} parties the run can have "
            "(one SuperNode serves at least one device: num-devices)"
        )
    honest = honest_parties(min_survivors, colluders)

    def sigma_of(s: float) -> float:
        return local_sigma_for(noise_multiplier, s, dimension, honest)

    if scale is None:
        try:
            s = choose_scale(dimension, max_records=num_records, parties=max_parties,
                             local_noise_std=sigma_of)
        except ValueError as exc:
            raise ValueError(f"secagg-scale: {exc}") from None
    else:
        s = float(scale)
        need = headroom(s, max_records=num_records, parties=max_parties, local_noise_std=sigma_of(s))
        if not need < HALF:
            raise ValueError(
                f"secagg-scale={scale}: the aggregate could reach {need:.3g} > 2^31 (headroom check with "
                f"{num_records} records and {max_parties} parties); lower it or leave it unset"
            )
    local = sigma_of(s)
    if not local >= MIN_LOCAL_SIGMA:
        raise NoEvent(
            f"secagg-scale={s:g}: each party's noise std σ_loc={local:.3g} is below {MIN_LOCAL_SIGMA} "
            "integer units (the distributed discrete Gaussian is not accounted there); raise the scale"
        )
    return SecAggPlan(local, s, int(dimension), int(min_survivors), int(colluders), neighbours, threshold,
                      int(max_parties))


def secagg_event(plan: SecAggPlan, sampling_rate: float) -> DistributedDiscreteGaussian:
    """The event one secure-aggregation round is charged: ``n_h = n_min − t_c``."""
    return DistributedDiscreteGaussian(plan.local_sigma, plan.honest_parties, plan.scale, plan.dimension,
                                       sampling_rate)
