"""Privacy accounting for feature differential privacy (FDP).

Mechanism
---------
One round of Algorithm 1 (or of its federated form) releases the sum of per-record
private gradients, each clipped to L2 norm ``C`` (so adding or removing one record
moves the sum by at most ``C``), over a Poisson-subsampled batch (each record joins
independently with probability ``q``), plus Gaussian noise ``N(0, sigma^2 C^2 I)``.
Public work (public gradients, public pre-training) depends on ``Psi(S)`` only and
costs nothing (Remark 2).  By **Theorem 5** of the FDP paper each round is dominated
by the pair (in units of ``C``)

    P = N(0, sigma^2)                            the simulator: the record is absent,
    Q = (1 - q) N(0, sigma^2) + q N(1, sigma^2)  the record is present,

and rounds compose adaptively (Theorem 3): a run is ``f-DP_i^Psi`` with
``f = T(P_1 x ... x P_T, Q_1 x ... x Q_T)``, each round with its own ``(sigma, q)``.

Participation
-------------
With Poisson device sampling (record unit) a round touches a record only if its
device is drawn, with probability ``p`` (``SubsampledGaussian.participation``).  Whether
it was drawn is not secret (the record's device-mates reveal it), so the round is
dominated by the mixture ``p (delta_1 x Q) + (1 - p) (delta_0 x P)`` versus
``p (delta_1 x P) + (1 - p) (delta_0 x P)``: its privacy loss is the subsampled
Gaussian's with probability ``p`` and exactly 0 otherwise, in both orderings.
Rate ``p q`` (the same mixture with the label hidden) is *not* a valid bound.

Neighbouring relations
----------------------
``"add-remove"`` (Definition 6, simulation-based; the headline number).  Definition 6
asks for ``Pr[M(S u {x}) in E] <= 1 - f(Pr[sim(S, Psi(x)) in E])`` *and* the reverse
inequality, so both orderings of the pair are accounted:

* **remove**: ``delta(eps) = H_{e^eps}(Q || P)``, privacy loss ``log(Q/P)`` under ``Q``.
  This is the ordering prv-accountant's ``PoissonSubsampledGaussianMechanism`` models
  (its CDF is that of ``log(Q/P)(w)`` with ``w ~ Q``), and dp-accounting's ``REMOVE``
  (``mu_upper`` = the mixture, ``mu_lower`` = the Gaussian).
* **add**: ``delta(eps) = H_{e^eps}(P || Q)``, privacy loss ``log(P/Q)`` under ``P``,
  at most ``-log(1 - q)`` per round (dp-accounting's ``ADD``).  prv-accountant has no
  random variable for it; it is implemented in :mod:`~fedfdp.accounting.prv`.

The epsilon reported is the larger of the two, as dp-accounting does for
``ADD_OR_REMOVE_ONE``.

``"replacement"`` (Definition 5) follows from add/remove by **Proposition 1**
(``f-DP_i => (f o f)-DP_r``), used in its (eps, delta) form:
``(eps, delta)-DP_i => (2 eps, delta (1 + e^eps))-DP_r``, optimised over ``delta_i``
with certified add/remove upper bounds (:mod:`~fedfdp.accounting.replacement`).

Modules
-------
:mod:`~fedfdp.accounting.events`
    The one event vocabulary: :class:`SubsampledGaussian`,
    :class:`ThresholdedHistogram`, :class:`CorrDPRound`,
    :class:`DistributedDiscreteGaussian` (immutable, validated, JSON round-trip),
    :class:`Relation`. It imports nothing above :mod:`fedfdp.validate` (the one
    family of number checks) and
    :mod:`~fedfdp.accounting.discrete_gaussian_bounds` (the distributed discrete
    Gaussian's sensitivity and lemmas).
:mod:`~fedfdp.accounting.protocol`
    The one accountant protocol (:class:`Accountant`), the one merge
    (:func:`~fedfdp.accounting.protocol.append_repeated`, :class:`Repeated`), the one
    calibrator (:func:`calibrate`) and the default δ (:func:`default_delta`).
:mod:`~fedfdp.accounting.accountant`
    :class:`FDPAccountant` (ledger of :class:`Repeated` events, ``epsilon``, budget
    checks, state), :class:`EpsilonBound`, :class:`PrivacyBudgetExhausted`,
    :func:`epsilon_for`.
:mod:`~fedfdp.accounting.distributed`
    Secure aggregation's distributed discrete Gaussian rounds: routes A and B and
    :class:`~fedfdp.accounting.distributed.DistributedAccountant`.
:mod:`~fedfdp.accounting.prv`
    The privacy random variable of one round (Theorem 5's pair): loss, truncation,
    discretisation, Renyi moments, the Gaussian closed form.
:mod:`~fedfdp.accounting.composition`
    Numerical composition of a ledger (Theorem 3) in Fourier space, with its error
    terms; :mod:`~fedfdp.accounting.curves` evaluates the composed hockey-stick curves.
:mod:`~fedfdp.accounting.replacement`
    The replacement epsilon by Proposition 1.
:mod:`~fedfdp.accounting.tradeoff`
    The composed trade-off function and Theorem 4's attribute-inference bound.
:mod:`~fedfdp.accounting.calibration`
    The smallest noise multiplier that meets a target epsilon.
:mod:`~fedfdp.accounting.prv_reference`
    The same epsilon through prv-accountant itself (slow cross-check).

Memory and time are bounded for every input
(:data:`~fedfdp.accounting.composition.MEMORY_LIMIT_BYTES` = 1 GiB for the numerical
arrays): what the numerical accountant cannot resolve gets a coarser certified
interval or the Renyi-DP bound, never an exhausted machine.

Nothing here draws random numbers.
"""

from fedfdp.accounting.accountant import (
    RELATIONS,
    EpsilonBound,
    FDPAccountant,
    PrivacyBudgetExhausted,
    Repeated,
    epsilon_for,
)
from fedfdp.accounting.calibration import calibrate_noise_multiplier
from fedfdp.accounting.composition import MEMORY_LIMIT_BYTES
from fedfdp.accounting.events import (
    CorrDPClass,
    CorrDPRound,
    DistributedDiscreteGaussian,
    EventKind,
    PrivacyEvent,
    Relation,
    SubsampledGaussian,
    ThresholdedHistogram,
    event_from_dict,
)
from fedfdp.accounting.protocol import MIN_NOISE_MULTIPLIER, Accountant, NoEvent, calibrate, default_delta
from fedfdp.accounting.prv_reference import epsilon_prv_accountant
from fedfdp.accounting.tradeoff import (
    attribute_inference_bound,
    plot_tradeoff,
    save_tradeoff_csv,
    tradeoff_curve,
)

__all__ = [
    "MEMORY_LIMIT_BYTES",
    "MIN_NOISE_MULTIPLIER",
    "RELATIONS",
    "Accountant",
    "CorrDPClass",
    "CorrDPRound",
    "DistributedDiscreteGaussian",
    "EpsilonBound",
    "EventKind",
    "FDPAccountant",
    "NoEvent",
    "PrivacyBudgetExhausted",
    "PrivacyEvent",
    "Relation",
    "Repeated",
    "SubsampledGaussian",
    "ThresholdedHistogram",
    "attribute_inference_bound",
    "calibrate",
    "calibrate_noise_multiplier",
    "default_delta",
    "epsilon_for",
    "epsilon_prv_accountant",
    "event_from_dict",
    "plot_tradeoff",
    "save_tradeoff_csv",
    "tradeoff_curve",
]
