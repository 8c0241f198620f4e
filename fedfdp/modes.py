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


@dataclass(frozen=True)
class Phase:
    """What one round computes.

    Attributes
    ----------
    name : str
    private_loss : str
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

    name: str
    private_loss: str
    clip: bool
    noise: bool
    public: bool
    per_block: bool = False

    @property
    def has_private(self) -> bool:
        """Whether the round touches private data."""
        return self.private_loss != "none"


PHASES: dict[str, Phase] = {
    "nonprivate": Phase("nonprivate", "full", clip=False, noise=False, public=False),
    "public": Phase("public", "none", clip=False, noise=False, public=True),
    "dp": Phase("dp", "full", clip=True, noise=True, public=False),
    "fdp": Phase("fdp", "private", clip=True, noise=True, public=True),
    "corrdp": Phase("corrdp", "full", clip=True, noise=True, public=False, per_block=True),
}


def phase_for_round(mode: str, public_pretrain_rounds: int, round_: int) -> Phase:
    """The phase of round ``round_`` (1-based) under ``mode``."""
    if round_ < 1:
        raise ValueError(f"round={round_}: rounds are numbered from 1")
    if round_ <= public_pretrain_rounds:
        return PHASES["public"]
    if mode == "fdp-dpsgd":
        return PHASES["dp"]
    if mode not in PHASES:
        raise ValueError(f"mode={mode!r}: unknown")
    return PHASES[mode]
