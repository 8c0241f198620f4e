"""The privacy audit's harness (used by ``fedfdp audit`` and the tests).

``canaries``
    the white-box canary audit: crafted canaries, one round of the real client
    and strategy per trial, the test choice and the bound.
``bugs``
    planted bugs as broken components, passed through the seams a normal run
    uses (:class:`fedfdp.contribution.ClientParts`,
    :class:`fedfdp.round_engine.ServerParts`).
``one_run``
    one-run auditing of a whole training run (Steinke, Nasr, Jagielski 2023):
    canaries in or out by fair coins, one run of the production engine, a lower
    bound on ε from the guesses.
``inprocess``
    the round's train messages from the real strategy in this process, without
    a Flower runtime (the trials hand them to the real client handler).
"""
