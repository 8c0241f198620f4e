"""The default recipe of Algorithm 1's private part for image models: ``C`` follows the private norms.

Algorithm 1 of the FDP paper (arXiv:2506.19836) steps along::

    g = mean ∇ℓ_pub over a public batch            (unclipped, no noise)
      + α · (Σ_i clip_C(∇ℓ_priv,i) + N(0, σ²C²I)) / (qN)

Only the second term is clipped, so ``C`` sets how much the private
correction weighs against the public gradient. Measured on the 14×14 DDPM
(docs/images.md, "Diffusion model (DDPM) at 14×14"): at the
project's ``C = 0.1`` about half of a batch's private norms exceed ``C`` (the
median is 1–1.4 ``C``), but their 90 % quantile is 25–35 ``C`` — the private
gradient's mass sits in a heavy upper tail — and the clipped private sum
``/(qN)`` has norm ≈ 0.04 — 5 % of the unclipped one, 0.85 at the public
model — against a public gradient of 0.2–2.6: the update
follows the public loss and the model stays near the blurry public-view
model. Choosing ``α`` by hand (α = 10 there) is tuning on the evaluation
metric.

The recipe instead lets ``C`` follow a quantile of the private norms by the
project's adaptive clipping (:mod:`fedfdp.quantile_clipping`, Andrew et al.,
NeurIPS 2021, Algorithm 1), with ``α = 1``:

* each private step releases the number of records of its Poisson batch whose
  private gradient had norm ``≤ C`` with Gaussian noise ``N(0, σ_b²)`` from
  the secret stream (right after the gradient noise), and moves
  ``C ← C·exp(−η(b̃ − γ))``, ``b̃ = noisy count / (qN)``;
* the count's noise is charged: sum and count together are one Gaussian
  mechanism of multiplier ``σ_eff`` with ``σ_eff⁻² = σ⁻² + σ_b⁻²``
  (Andrew et al., Thm. 1); ``σ_eff`` is calibrated to the target ε and the
  count takes the share ``r`` of ``1/σ_eff²`` (:func:`split_noise`), so the
  printed ε (add/remove, upper bound, the run's δ) covers the adaptation;
* ``C`` is post-processing of released values (the noisy counts) and of the
  public starting value; each step is still a Poisson-subsampled Gaussian
  mechanism with sensitivity ``C_t`` (the current norm, fixed before the
  step's coins) and multiplier ``σ_eff``.

``γ = 0.9``: a quantile in the upper tail, because there the mass is — a
median target leaves ``C`` where it started (measured: 17 steps at ``γ = 0.5``
kept ``C`` at 0.10). It is read off the norm distribution measured at the
public model, not chosen on the Fréchet distance; the target is capped at
``1 − 2σ_b/(qN)`` where the noisy count could not resolve it (as the engine's
recipe). The larger ``C`` costs noise ``σC`` per step, which averages over the
``T`` steps, while a clipping bias toward the public model does not.
``η = 0.2`` and ``r = 0.05`` are the engine's defaults for
``clipping-learning-rate`` and ``clipping-budget-share``. The engine's own
``"auto"`` quantile (:func:`fedfdp.quantile_clipping.recipe_quantile`) keeps
``C`` fixed for a noise-dominated model such as the U-Net (``σ√d/(qN) > 1``):
it weighs one step's clipping bias against that step's noise, not against the
unclipped public term the private part is added to, which is what decides
here.

The rule reads no private value except through the noisy counts: the next
``C`` is a function of the current ``C``, the count of norms ``≤ C`` and the
count's noise (:func:`next_clipping_norm`); changing a record's private pixels
with ``Ψ(x)`` fixed changes the rule's output only through that count
(sensitivity 1). ``tests/test_images_recipe.py`` checks these properties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch

from fedfdp.entropy import BitStream
from fedfdp.quantile_clipping import DIFFUSION_QUANTILE, adapt_clipping_norm, capped_quantile, split_noise

__all__ = [
    "DEFAULT_RECIPE",
    "FIXED_CLIPPING",
    "ClippingRule",
    "ImageRecipe",
    "StepDiagnostics",
    "next_clipping_norm",
    "step_diagnostics",
    "unclipped_count",
]


class ClippingRule(StrEnum):
    """How ``C`` of the private part moves: ``fixed`` (the configured ``C`` throughout)
    or ``quantile`` (adaptive clipping toward the ``γ``-quantile of the private norms).
    """

    FIXED = "fixed"
    QUANTILE = "quantile"


@dataclass(frozen=True)
class ImageRecipe:
    """The private part's clipping rule (module docstring).

    Parameters
    ----------
    rule : ClippingRule
        ``quantile`` (default) or ``fixed`` (its string is accepted).
    quantile : float
        ``γ`` in (0, 1): the share of a batch's private norms ``C`` aims to leave
        unclipped (at most ``1 − 2σ_b/(qN)``, :meth:`target`).
    learning_rate : float
        ``η > 0`` of the geometric step.
    budget_share : float
        ``r`` in (0, 1): the count's share of each step's ``1/σ_eff²``.
    """

    rule: ClippingRule = ClippingRule.QUANTILE
    quantile: float = DIFFUSION_QUANTILE
    learning_rate: float = 0.2
    budget_share: float = 0.05

    def __post_init__(self) -> None:
        if self.rule not in tuple(ClippingRule):
            raise ValueError(f"rule={self.rule!r}: must be one of {', '.join(ClippingRule)}")
        object.__setattr__(self, "rule", ClippingRule(self.rule))
        if not 0 < self.quantile < 1:
            raise ValueError(f"quantile={self.quantile!r}: must be in (0, 1)")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"learning_rate={self.learning_rate!r}: must be finite and > 0")
        if not 0 < self.budget_share < 1:
            raise ValueError(f"budget_share={self.budget_share!r}: must be in (0, 1)")

    @property
    def adaptive(self) -> bool:
        """Whether ``C`` moves (a noisy count is released each private step)."""
        return self.rule is ClippingRule.QUANTILE

    def target(self, count_std: float, expected_batch: float) -> float:
        """The quantile ``C`` moves toward: ``γ``, but at most ``1 − 2σ_b/(qN)`` (closer to 1
        the noisy count cannot resolve it; the engine's recipe caps it the same way).
        """
        target = capped_quantile(self.quantile, count_std, expected_batch)
        if target <= 0:
            raise ValueError(f"count noise σ_b={count_std:.3g} for an expected batch of "
                             f"{expected_batch:.3g}: the noisy count cannot resolve any quantile; "
                             "raise the rate or keep C fixed")
        return target

    def noise(self, accounted: float) -> tuple[float, float | None]:
        """``(σ, σ_b)``: the gradient's noise multiplier and the count's standard
        deviation for the accounted ``σ_eff`` (``(σ_eff, None)`` when ``C`` is fixed).
        """
        if not self.adaptive:
            return accounted, None
        return split_noise(accounted, self.budget_share)


#: The default for ``fdp`` on image models: ``C`` follows the median private norm.
DEFAULT_RECIPE = ImageRecipe()
#: The configured ``C`` throughout (and no count released).
FIXED_CLIPPING = ImageRecipe(ClippingRule.FIXED)


def unclipped_count(norms: torch.Tensor | np.ndarray, clipping_norm: float) -> int:
    """How many of ``norms`` are ``≤ C`` (left unchanged by ``min(1, C/‖g‖)``); a
    non-finite norm counts as clipped. Sensitivity 1 under add/remove of one record.
    """
    values = np.asarray(norms.detach().cpu() if isinstance(norms, torch.Tensor) else norms, dtype=np.float64)
    return int(np.count_nonzero(np.isfinite(values) & (values <= clipping_norm)))


def next_clipping_norm(
    recipe: ImageRecipe,
    clipping_norm: float,
    norms: torch.Tensor | np.ndarray,
    count_std: float,
    expected_batch: float,
    stream: BitStream,
) -> float:
    """``C`` of the next private step: one noisy count of ``norms ≤ C`` (noise
    ``N(0, σ_b²)``, one standard normal from ``stream``) and
    :func:`fedfdp.quantile_clipping.adapt_clipping_norm`'s geometric step.

    ``norms`` enter only through :func:`unclipped_count`.
    """
    if not recipe.adaptive:
        raise ValueError(f"rule={str(recipe.rule)!r}: C is fixed, there is no next norm to draw")
    return adapt_clipping_norm(clipping_norm, unclipped_count(norms, clipping_norm), count_std,
                               expected_batch, recipe.target(count_std, expected_batch), recipe.learning_rate,
                               stream)


@dataclass(frozen=True)
class StepDiagnostics:
    """What one private step looked like (a measuring aid: **never released** — the
    norms and the clipped sum are private values).

    Attributes
    ----------
    step : int
    clipping_norm : float
        ``C`` of the step.
    public_norm : float
        ``‖mean ∇ℓ_pub‖`` over the public batch (0 without a public part).
    private_norm : float
        ``‖Σ clip_C(∇ℓ_priv,i)‖ / (qN)`` (before the noise and ``α``).
    noise_norm : float
        ``‖noise‖ / (qN)``.
    batch : int
        Records in the Poisson batch.
    fraction_clipped : float
        Share of the batch with norm ``> C``.
    mean_scale : float
        Mean of ``min(1, C/‖∇ℓ_priv,i‖)``: the shrinkage of the private term against
        its unclipped estimate when the per-record gradients point alike.
    norm_q10, norm_median, norm_q90 : float
        Quantiles of the per-record private norms.
    public_record_median : float
        Median per-record ``‖∇ℓ_pub,i‖`` over the public batch (NaN when not measured).
    """

    step: int
    clipping_norm: float
    public_norm: float
    private_norm: float
    noise_norm: float
    batch: int
    fraction_clipped: float
    mean_scale: float
    norm_q10: float
    norm_median: float
    norm_q90: float
    public_record_median: float = math.nan


def _norm(tensors: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in tensors))


def step_diagnostics(
    step: int,
    clipping_norm: float,
    norms: torch.Tensor,
    clipped: list[torch.Tensor],
    noisy: list[torch.Tensor],
    expected_batch: float,
    public_mean: list[torch.Tensor] | None,
    public_norms: torch.Tensor | None = None,
) -> StepDiagnostics:
    """The :class:`StepDiagnostics` of one step from its per-record norms, clipped sum,
    noisy sum (same scale, before ``/(qN)``) and public mean gradient.
    """
    values = norms.detach().double().cpu()
    finite = values[torch.isfinite(values)]
    if len(finite):
        q10, median, q90 = (float(v) for v in torch.quantile(finite, torch.tensor([0.1, 0.5, 0.9],
                                                                                   dtype=torch.float64)))
        scale = float(torch.clamp(clipping_norm / finite, max=1.0).mean())
        clipped_share = float((finite > clipping_norm).double().mean())
    else:
        q10 = median = q90 = scale = clipped_share = math.nan
    noise = [n.detach().cpu().double() - c.detach().cpu().double()
             for n, c in zip(noisy, clipped, strict=True)]
    pub_median = math.nan
    if public_norms is not None and len(public_norms):
        pub_median = float(public_norms.detach().double().cpu().median())
    return StepDiagnostics(
        step=step,
        clipping_norm=float(clipping_norm),
        public_norm=_norm(public_mean) if public_mean is not None else 0.0,
        private_norm=_norm(clipped) / expected_batch,
        noise_norm=_norm(noise) / expected_batch,
        batch=len(values),
        fraction_clipped=clipped_share,
        mean_scale=scale,
        norm_q10=q10,
        norm_median=median,
        norm_q90=q90,
        public_record_median=pub_median,
    )
