"""Exceptions of the secure-aggregation protocol (:mod:`fedfdp.secagg.session`).

Every failure of a SecAgg+ round raises a subclass of :class:`SecAggError`, so a
caller (the Flower round driver) can abort the round with one ``except``; the
subclasses say why, and the message is one line naming the node, the field or the
counts involved.
"""

from __future__ import annotations

from enum import Enum


class Stage(Enum):
    """The four stages of one SecAgg+ round, in order: the one vocabulary of stages.

    ``value`` is the stage's name in messages (``stage setup: …``); :attr:`action` its
    Flower ``train`` action (``sa_setup`` …, :data:`fedfdp.secagg.wire.STAGES`) and
    :attr:`message_type` the Flower message type (``train.sa_setup`` …); the request
    and reply classes of each stage are :data:`fedfdp.secagg.wire.STAGE_MESSAGES`.

    Examples
    --------
    >>> [s.action for s in Stage]
    ['sa_setup', 'sa_keys', 'sa_collect', 'sa_unmask']
    >>> Stage.COLLECT.message_type, Stage.from_action("sa_unmask")
    ('train.sa_collect', <Stage.UNMASK: 'unmask'>)
    """

    SETUP = "setup"
    SHARE_KEYS = "share_keys"
    COLLECT = "collect"
    UNMASK = "unmask"

    @property
    def action(self) -> str:
        """The stage's Flower ``train`` action: ``sa_setup``, ``sa_keys``, ``sa_collect``,
        ``sa_unmask``.
        """
        return _ACTIONS[self]

    @property
    def message_type(self) -> str:
        """The Flower message type of the stage's request and reply (``train.<action>``)."""
        return f"train.{self.action}"

    @classmethod
    def from_action(cls, action: str) -> Stage:
        """The stage whose :attr:`action` is ``action`` (``ValueError`` otherwise)."""
        for stage in cls:
            if stage.action == action:
                return stage
        raise ValueError(f"action={action!r}: not a secure-aggregation stage "
                         f"(expected one of {[s.action for s in cls]})")


_ACTIONS = {
    Stage.SETUP: "sa_setup",
    Stage.SHARE_KEYS: "sa_keys",
    Stage.COLLECT: "sa_collect",
    Stage.UNMASK: "sa_unmask",
}


class SecAggError(Exception):
    """Base class: the round cannot go on."""


class MessageError(SecAggError, ValueError):
    """A message is malformed or does not fit the session (wrong length, unknown or
    duplicate id, wrong round).

    Attributes
    ----------
    field : str
        The message field at fault.
    node_id : int or None
        The sender (or addressee) concerned, when known.
    """

    def __init__(self, message: str, *, field: str, node_id: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.node_id = node_id


class AuthenticationError(MessageError):
    """An authenticated ciphertext failed to open: tampered bytes, wrong key or wrong
    associated data (source, destination, round).
    """


class RequestRefused(SecAggError):
    """A client refuses a request that would break the protocol's guarantee (both
    shares of one node, a second unmask, a request out of order); the client's
    session is over and its secrets are wiped.
    """


class ThresholdError(SecAggError):
    """A node has fewer than ``threshold`` live members in its neighbourhood, so its
    secrets could not be reconstructed: the stage fails.

    Attributes
    ----------
    stage : Stage
    node_id : int
    live : int
        Live members counted (the node itself included when it is live).
    threshold : int
    """

    def __init__(self, stage: Stage, node_id: int, live: int, threshold: int, what: str) -> None:
        super().__init__(
            f"stage {stage.value}: node {node_id} has {live} {what}, fewer than the threshold t={threshold}"
        )
        self.stage = stage
        self.node_id = node_id
        self.live = live
        self.threshold = threshold


class TooFewSurvivors(SecAggError):
    """Fewer nodes survive than the configured minimum: the server aborts without
    asking anyone for a share (the masked vectors stay one-time pads).

    Attributes
    ----------
    stage : Stage
    survivors : int
    minimum : int
    """

    def __init__(self, stage: Stage, survivors: int, minimum: int) -> None:
        super().__init__(
            f"stage {stage.value}: {survivors} nodes survive, fewer than min_survivors={minimum}; "
            "the round is aborted without unmasking"
        )
        self.stage = stage
        self.survivors = survivors
        self.minimum = minimum


class ConsistencyError(SecAggError):
    """The round's survivor set cannot be confirmed: its nodes' graph is disconnected
    (unmasking would release the sums of its parts), or some survivor did not sign the
    same survivor set, dead set and round digest. The server aborts before unmasking
    (nothing charged); a node refuses to unmask.
    """


class ReconstructionError(SecAggError):
    """Shares combined to a secret that contradicts the node's published key."""


class SessionStateError(SecAggError, RuntimeError):
    """A server session method was called out of order, or after the round ended or
    failed.
    """
