"""The deployment authority's step for secure aggregation, done by ``fedfdp run`` for
simulated nodes: every party's long-term signing key in its own state folder, and the
roster of their public keys.

In a deployment each device's owner creates the key on the device
(:meth:`fedfdp.secagg.identity.SigningKey.load_or_create` in its ``node-state``
directory, the first time it takes part) and an authority outside the server collects
the public keys into the roster every node's policy names. A simulation has no such
authority, so the orchestrator stands in for it: :func:`write_identities` creates (or
reuses) each simulated node's key in that node's state folder — the private key never
leaves it — and writes the roster. The server is never given either.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fedfdp.secagg.identity import SIGNING_KEY_FILE, Roster, SigningKey

__all__ = ["write_identities"]


def write_identities(state_dirs: Mapping[str, str | Path], roster: str | Path) -> Roster:
    """Each party's key in ``state_dirs[name] / SIGNING_KEY_FILE`` (created from the OS
    CSPRNG when absent, kept when present) and the roster of their public keys at
    ``roster`` (TOML, :meth:`fedfdp.secagg.identity.Roster.to_file`).

    Parameters
    ----------
    state_dirs : mapping of str to path
        Party name → its state folder (a simulated node's ``node-state``).
    roster : path
        Where the roster is written (replaced whole).

    Returns
    -------
    Roster
    """
    if not state_dirs:
        raise ValueError("state_dirs: no party to write an identity for")
    keys = {name: SigningKey.load_or_create(Path(folder) / SIGNING_KEY_FILE).public
            for name, folder in state_dirs.items()}
    written = Roster(keys)
    written.to_file(roster)
    return written
