"""Attribute inference on a trained model: Theorem 4 of the FDP paper, measured.

Threat model (Def. 7 of ``fdp_protected_attributes.txt``)
---------------------------------------------------------
A target record ``x`` with label ``y`` is in the training set. The attacker
sees the trained model ``θ``, knows the target's public features ``Ψ(x) = u``
and its label (label and Ψ are disclosed by design), and guesses the private
features. Here the private features are discretised into the cells of an
:class:`AttributeGrid`; a guess succeeds when it names the target's cell
(``d`` = "same cell", ``ρ = 0``).

What the attacker may know besides ``θ``, ``Ψ(x)`` and ``y``: the training
*algorithm* and its configuration (as for any DP mechanism), and the data's
*generative model*, from which it draws fresh records of its own (another data
seed). It never sees the training records' private values.

Bound (Theorem 4, Def. 8)
-------------------------
For a mechanism that is feature ``f``-DP (add/remove, Def. 6), every attacker's
success on ``x ∼ X | Ψ(X) = u`` is at most ``1 − f(Ball(X, u))``, where
``Ball`` is the success of the best guess made **without** the model:
``max_c P(c | u)``. On the fleet the private readings depend on ``Ψ(x)`` only
through the label, so ``Ball = max_c P(c | y)``, estimated on a fresh draw of
the generative model (:func:`reference_priors`). Averaged over the targets, by
convexity of ``f``, mean success ``≤ 1 − f(mean Ball)``;
:func:`fedfdp.accounting.attribute_inference_bound` computes it from a run's
ledger.

Attacks
-------
* **loss** — the candidate with the smallest model loss;
* **loss + marginal prior** — maximise ``log P(c) − loss(c)``;
* **calibrated** (likelihood ratio against reference models, in the spirit of
  LiRA, Carlini et al. 2022) — maximise
  ``log P(c | y) + λ·(s_θ(c) − mean_r s_r(c))``, where ``s(c)`` is the model's
  logit-scaled confidence in the true label with candidate ``c`` written into
  the private columns (:func:`candidate_margins`) and the ``s_r`` come from
  *reference models* trained by the attacker with the same algorithm and
  configuration on fresh draws of the generative model (its own data seeds
  and randomness; :func:`train_references`). A model that only generalises
  behaves like the references on a target, the correction averages out and the
  attack is the prior's guess (success ``≈ Ball``); only what the model
  memorised about the target itself can lift it above ``Ball``. ``λ`` is
  chosen without the targets (:func:`choose_weight`): leave-one-out over the
  reference models, each attacked on its own training records (the attacker
  generated them, so it knows their private values).

Everything here is independent of Flower.
"""

from __future__ import annotations

from fedfdp.attack.inference import (
    AttackOutcome,
    AttributeGrid,
    attribute_attack,
    calibrated_scores,
    candidate_losses,
    candidate_margins,
    cell_priors,
    excess_over_ball,
)
from fedfdp.attack.runs import (
    PRIOR_SEED_OFFSET,
    REFERENCE_SEED_OFFSET,
    Reference,
    attribute_attack_run,
    choose_weight,
    fleet_grid,
    pool_results,
    read_run,
    reference_priors,
    run_accountant,
    train_references,
)

__all__ = [
    "PRIOR_SEED_OFFSET",
    "REFERENCE_SEED_OFFSET",
    "AttackOutcome",
    "AttributeGrid",
    "Reference",
    "attribute_attack",
    "attribute_attack_run",
    "calibrated_scores",
    "candidate_losses",
    "candidate_margins",
    "cell_priors",
    "choose_weight",
    "excess_over_ball",
    "fleet_grid",
    "pool_results",
    "read_run",
    "reference_priors",
    "run_accountant",
    "train_references",
]

