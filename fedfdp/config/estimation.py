"""What the default budget of released statistics scales with: the run's reference ε and δ.

With ``private-statistics = "estimate"`` the encodings of undeclared private columns are
released with noise charged before round 1 (:mod:`fedfdp.data.private_statistics`). When
``estimation-epsilon`` is unset (``"auto"``, the default) their budget is a share of the
run's own budget, so that it costs training little whatever the target: the data loaders,
which see only the data section, read that reference from
:attr:`DataConfig.estimation_reference <fedfdp.config.DataConfig>`, set by
:class:`~fedfdp.config.Config` from its privacy section (like
:attr:`DataConfig.protected <fedfdp.config.DataConfig>`). A data section built outside a
configuration has no reference, and an automatic budget is then refused rather than
guessed: the noise released and the ε charged must come from the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedfdp.config.keys import DEFAULT_TARGET_EPSILON
from fedfdp.config.values import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from fedfdp.config.schema import PrivacyConfig

__all__ = ["EstimationReference", "estimation_reference"]


@dataclass(frozen=True)
class EstimationReference:
    """The run's budget an automatic ``estimation-epsilon`` is a share of.

    Attributes
    ----------
    epsilon : float
        The run's reference ε (finite, > 0): :func:`estimation_reference`.
    delta : float or None
        The run's ``delta`` when configured (in ``(0, 1)``); ``None``: the default
        ``1/(2N)``, ``N`` the training records, known once the data is read.

    Examples
    --------
    >>> EstimationReference(1.0, None).epsilon
    1.0
    >>> EstimationReference(0.0, None)
    Traceback (most recent call last):
    ...
    fedfdp.config.values.ConfigError: estimation reference epsilon=0.0: must be finite and > 0
    """

    epsilon: float
    delta: float | None = None

    def __post_init__(self) -> None:
        eps = self.epsilon
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not (math.isfinite(eps) and eps > 0):
            raise ConfigError(f"estimation reference epsilon={eps!r}: must be finite and > 0")
        object.__setattr__(self, "epsilon", float(eps))
        d = self.delta
        if d is not None and (isinstance(d, bool) or not isinstance(d, int | float) or not 0.0 < d < 1.0):
            raise ConfigError(f"estimation reference delta={d!r}: must be in (0, 1) or None")


def estimation_reference(privacy: PrivacyConfig) -> EstimationReference:
    """The reference of ``privacy``: ε is the calibration target (``target-epsilon``, or
    the default target 2.0 when σ is calibrated), else ``max-epsilon`` when σ is given with
    a cap, else the default target 2.0 (σ given without a cap, or a mode that adds no
    noise: the estimates are then the run's only ε); δ is ``delta`` when set.

    Examples
    --------
    >>> from fedfdp.config import PrivacyConfig
    >>> estimation_reference(PrivacyConfig(target_epsilon=1.0))
    EstimationReference(epsilon=1.0, delta=None)
    >>> estimation_reference(PrivacyConfig(noise_multiplier=1.0, delta=1e-6))
    EstimationReference(epsilon=2.0, delta=1e-06)
    """
    epsilon = privacy.calibration_target
    if epsilon is None:
        epsilon = privacy.max_epsilon if privacy.max_epsilon is not None else DEFAULT_TARGET_EPSILON
    return EstimationReference(float(epsilon), privacy.delta)
