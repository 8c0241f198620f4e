"""Training modes as configuration: what each round computes.

Every mode runs the same client and server code; a :class:`Phase` says which
parts are active in a round.

==============  ====================  ===========================  =====  ===========
phase           private part          public part                  noise  ε
==============  ====================  ===========================  =====  ===========
``nonprivate``  full loss, no clip    —                            no     ∞
``public``      —                     ``ℓ_pub`` on Ψ(x)            no     0 (FDP)
``dp``          full loss, clipped    —                            yes    DP ⇒ FDP
``fdp``         ``ℓ − ℓ_pub``, clip   ``ℓ_pub`` on Ψ(x), unclipped yes    FDP (Thm 5)
``corrdp``      full loss, clipped    —                            per    CorrDP
                per block                                          block  (named)
==============  ====================  ===========================  =====  ===========

``corrdp`` is CorrDP-SGD (``fedfdp.corrdp``): its private sum is clipped per block of
a GLM's parameters by the CorrDP aggregator, and the server's CorrDP mechanism adds
per-block noise (Eq. (3)); the honest joint-clipping aggregator refuses it.

The configured ``mode`` maps to a phase per round: the first
``public-pretrain-rounds`` rounds are ``public`` (Remark 2: free), then ``dp``
for ``fdp-dpsgd`` (the paper's "FDP (DP-SGD)") or the mode itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fedfdp.config import Mode


class PrivateLoss(StrEnum):
    """Which loss a round's private part differentiates."""

    NONE = "none"
    FULL = "full"        # ℓ
    PRIVATE = "private"  # ℓ − ℓ_pub


@dataclass(frozen=True)
class Phase:
    """What one round computes.

    Attributes
    ----------
    name : Mode
        The mode whose round this is (``fdp-dpsgd`` runs ``public`` then ``dp`` rounds).
    private_loss : PrivateLoss
        ``none``, ``full`` (ℓ) or ``private`` (ℓ − ℓ_pub).
    clip : bool
        Clip per-record private gradients to ``C``.
    noise : bool
        Add ``N(0, σ²C²)`` to the private sum (and spend ε).
    public : bool
        Compute the unclipped public gradient on an independent uniform batch.
    per_block : bool
        Clip per block of a GLM's parameters (CorrDP-SGD) instead of as one vector.
    """

    name: Mode
    private_loss: PrivateLoss
    clip: bool
    noise: bool
    public: bool
    per_block: bool = False

    @property
    def has_private(self) -> bool:
        """Whether the round touches private data."""
        return self.private_loss is not PrivateLoss.NONE


#: The phase of each mode's private rounds (``fdp-dpsgd`` has none of its own:
#: :func:`phase_for_round`). Keyed by :class:`~fedfdp.config.Mode`, so a plain
#: string (``PHASES["dp"]``, a phase name read from an instruction) finds it too.
PHASES: dict[Mode, Phase] = {
    Mode.NONPRIVATE: Phase(Mode.NONPRIVATE, PrivateLoss.FULL, clip=False, noise=False, public=False),
    Mode.PUBLIC: Phase(Mode.PUBLIC, PrivateLoss.NONE, clip=False, noise=False, public=True),
    Mode.DP: Phase(Mode.DP, PrivateLoss.FULL, clip=True, noise=True, public=False),
    Mode.FDP: Phase(Mode.FDP, PrivateLoss.PRIVATE, clip=True, noise=True, public=True),
    Mode.CORRDP: Phase(Mode.CORRDP, PrivateLoss.FULL, clip=True, noise=True, public=False, per_block=True),
}


def phase_for_round(mode: Mode | str, public_pretrain_rounds: int, round_: int) -> Phase:
    """The phase of round ``round_`` (1-based) under ``mode``.

    Examples
    --------
    >>> phase_for_round(Mode.FDP_DPSGD, 2, 1).name, phase_for_round(Mode.FDP_DPSGD, 2, 3).name
    ('public', 'dp')
    """
    if round_ < 1:
        raise ValueError(f"round={round_}: rounds are numbered from 1")
    if round_ <= public_pretrain_rounds:
        return PHASES[Mode.PUBLIC]
    if mode == Mode.FDP_DPSGD:
        return PHASES[Mode.DP]
    if mode not in PHASES:
        raise ValueError(f"mode={mode!r}: unknown")
    return PHASES[Mode(mode)]
