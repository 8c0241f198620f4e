"""The components of a run, chosen in one place for every engine.

A run's privacy-deciding components are :class:`fedfdp.contribution.ClientParts`
(a node's secret entropy, batch sampler and private aggregator) and
:class:`fedfdp.server.ServerParts` (the server's secret entropy, noise mechanism,
sampling plan, accounting and projection). Which ones a configuration needs is
decided here, and only here: the centralised engine (:mod:`fedfdp.algorithm`), the
ClientApp (:mod:`clients.client_app`), the ServerApp (:mod:`strategies.server_app`),
``fedfdp compare`` and the audit's honest runs all call these functions; the audit
then swaps one component for a planted bug through the same seams.

=========================  ===========================  ========================================
mode                       node (``ClientParts``)        server (``ServerParts``)
=========================  ===========================  ========================================
``dp``, ``fdp``, ...       joint clipping to ``C``       ``N(0, σ²C²I)``; add/remove accounting
``corrdp``                 per-block clipping            per-block noise (Eq. (3)), projection of
                           (:class:`~fedfdp.corrdp.run.  the weights to ``‖W[:, k]‖ ≤ D``, per-class
                           BlockClippedSum`)             CorrDP accounting (``epsilon_corrdp``)
=========================  ===========================  ========================================

Secret randomness comes from :func:`fedfdp.entropy.run_secrets` (the OS CSPRNG, or
the explicit ``reproducible-noise`` opt-in).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from fedfdp.config import Config, Mode
from fedfdp.contribution import ClientParts
from fedfdp.corrdp.noise import corrdp_mechanism_factory, project_weights_
from fedfdp.corrdp.run import BlockClippedSum, corrdp_accounting, corrdp_setup
from fedfdp.entropy import SecretSource, run_secrets
from fedfdp.mechanism import PublicFacts, ResolvedMechanism, resolve_mechanism, run_accounting
from fedfdp.server import ServerParts

if TYPE_CHECKING:
    from fedfdp.data import FederatedData


def _refuse_images(data: FederatedData) -> None:
    if data.is_image:
        raise ValueError(
            f"mode='corrdp': dataset {data.name!r} holds images; CorrDP-SGD is for logistic regression "
            "on tabular features"
        )


def client_parts_for(cfg: Config, data: FederatedData, secrets: SecretSource | None = None) -> ClientParts:
    """A node's components for ``cfg`` on ``data`` (the dataset's schema: columns and
    classes; a node never estimates TVs). ``secrets``: default as ``cfg`` asks.

    Examples
    --------
    >>> from fedfdp import load_config
    >>> from fedfdp.data import load_dataset
    >>> cfg = load_config({"mode": "corrdp", "dataset": "correlated", "insensitive-tv": "*=0.5"})
    >>> type(client_parts_for(cfg, load_dataset(cfg.data)).aggregate).__name__
    'BlockClippedSum'
    """
    secrets = secrets if secrets is not None else run_secrets(cfg)
    if cfg.privacy.mode is not Mode.CORRDP:
        return ClientParts(secrets=secrets)
    _refuse_images(data)
    layout = corrdp_setup(cfg, data, estimate=False).design
    return ClientParts(secrets=secrets, aggregate=BlockClippedSum(layout))


def server_parts_for(cfg: Config, data: FederatedData) -> ServerParts:
    """The server's components for ``cfg`` on ``data`` (for ``corrdp``: its design,
    TVs estimated in-sample on ``data``'s training records if asked).

    Examples
    --------
    >>> from fedfdp import load_config
    >>> from fedfdp.data import load_dataset
    >>> cfg = load_config({"mode": "corrdp", "dataset": "correlated", "insensitive-tv": "*=0.5"})
    >>> parts = server_parts_for(cfg, load_dataset(cfg.data))
    >>> str(parts.accounting.relation), parts.accounting.column
    ('corrdp', 'epsilon_corrdp')
    """
    if cfg.privacy.mode is not Mode.CORRDP:
        # aggregation = "secagg": the distributed accounting (fedfdp.mechanism.run_accounting)
        return ServerParts(accounting=run_accounting(cfg))
    _refuse_images(data)
    setup = corrdp_setup(cfg, data)
    return ServerParts(
        mechanism=corrdp_mechanism_factory(setup.design),
        accounting=corrdp_accounting(setup),
        project=partial(project_weights_, weight_bound=setup.design.weight_bound),
    )


def public_facts(cfg: Config, data: FederatedData) -> PublicFacts:
    """The public facts of ``cfg`` on ``data``: the device sizes and the trainable
    parameter count of the configured model (built on the ``meta`` device: no memory
    for its weights).
    """
    import torch

    from fedfdp.contribution import trainable
    from fedfdp.models import build_model_for

    with torch.device("meta"):
        model = build_model_for(cfg, data)
    num_params = sum(int(t.numel()) for t in trainable(model))
    return PublicFacts(tuple(int(s) for s in data.sizes.tolist()), num_params)


def mechanism_for(cfg: Config, data: FederatedData) -> ResolvedMechanism:
    """The resolved mechanism of ``cfg`` on ``data`` with the accounting its mode needs
    (:func:`fedfdp.mechanism.resolve_mechanism`: what the server resolves over every
    device — the CLI's checks before a run, the σ ``fedfdp compare`` records, the attack).

    Examples
    --------
    >>> from fedfdp import load_config
    >>> from fedfdp.data import load_dataset
    >>> cfg = load_config({"mode": "dp", "num-rounds": 10})
    >>> str(mechanism_for(cfg, load_dataset(cfg.data)).relation)
    'add-remove'
    """
    return resolve_mechanism(cfg, public_facts(cfg, data), accounting=server_parts_for(cfg, data).accounting)
