"""The privacy audit's harness (used by ``fedfdp audit`` and the tests).

``canaries``
    the white-box canary audit: crafted canaries, one round of the real client
    and strategy per trial, the test choice and the bound.
``bugs``
    planted bugs as broken components, passed through the seams a normal run
    uses (:class:`fedfdp.contribution.ClientParts`,
    :class:`fedfdp.server.ServerParts`).
``inprocess``
    drives the real ClientApp handlers and strategy in one process, without a
    Flower runtime (also the tests' Flower helpers).
"""
