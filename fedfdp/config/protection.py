"""What of a record a run's neighbouring relation protects: the one place that decides it.

A column's encoding (a range, a scale, a list of categories) and the label classes are
part of what a run releases: they fix the model's input layout and shape. Whatever the
relation protects may not be read off the data to build them; it is declared, or
estimated with noise the ledger charges (:mod:`fedfdp.data.private_statistics`). So the
set of columns treated as private is a function of the mode's relation, decided here by
:func:`protected` and read by the loaders from :attr:`DataConfig.protected
<fedfdp.config.DataConfig>` (set from the privacy section by :class:`~fedfdp.config.Config`):

=====================================  ===========================================  ====================
mode (relation)                        neighbours                                    protected
=====================================  ===========================================  ====================
``fdp``, ``fdp-dpsgd``, ``public``,    one record added or removed, its Ψ known      the private columns
``nonprivate`` (FDP, Definition 6)     (Ψ = the public columns and the label;
                                       ``fdp-dpsgd``'s public pre-training releases
                                       a model trained on Ψ, so its relation is FDP's)
the same with ``public-loss =           Ψ(x, y) = x: the label is not in Ψ             the private columns
"label-free"`` (label-DP)                                                             and the label
``corrdp`` (CorrDP, Def. 2.1)          one record's sensitive features, or one       every input column
                                       insensitive feature, replaced; labels fixed
``dp`` (DP)                            one record added or removed, nothing known    the whole record:
                                                                                     every column and the
                                                                                     label
=====================================  ===========================================  ====================
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedfdp.config.choices import Choice, Mode, PublicLoss

if TYPE_CHECKING:  # pragma: no cover
    from fedfdp.config.schema import DataConfig, PrivacyConfig

__all__ = ["Protected", "protected", "protected_columns", "undeclared_columns"]


class Protected(Choice):
    """What the relation protects of every record (module docstring).

    Examples
    --------
    >>> Protected.WHOLE_RECORD.inputs, Protected.WHOLE_RECORD.label, Protected.INPUTS.label
    (True, True, False)
    """

    PRIVATE_COLUMNS = "private-columns"
    PRIVATE_COLUMNS_AND_LABEL = "private-columns-and-label"
    INPUTS = "inputs"
    WHOLE_RECORD = "whole-record"

    @property
    def inputs(self) -> bool:
        """Whether every input column is protected, the public ones too (``dp``, ``corrdp``)."""
        return self in (Protected.INPUTS, Protected.WHOLE_RECORD)

    @property
    def label(self) -> bool:
        """Whether the label is protected (``dp``; label-DP in any mode that claims an ε)."""
        return self in (Protected.PRIVATE_COLUMNS_AND_LABEL, Protected.WHOLE_RECORD)


def protected(privacy: PrivacyConfig) -> Protected:
    """What ``privacy``'s relation protects (module docstring's table).

    Examples
    --------
    >>> from fedfdp.config import PrivacyConfig
    >>> str(protected(PrivacyConfig(mode="dp"))), str(protected(PrivacyConfig(mode="corrdp")))
    ('whole-record', 'inputs')
    """
    label_free = privacy.public_loss is PublicLoss.LABEL_FREE and privacy.mode is not Mode.NONPRIVATE
    if privacy.mode is Mode.DP:
        return Protected.WHOLE_RECORD
    if privacy.mode is Mode.CORRDP:
        return Protected.WHOLE_RECORD if label_free else Protected.INPUTS
    return Protected.PRIVATE_COLUMNS_AND_LABEL if label_free else Protected.PRIVATE_COLUMNS


def protected_columns(d: DataConfig) -> tuple[str, ...]:
    """The table columns whose encoding may not read the data under ``d.protected``: the
    private columns, every public column too when the inputs are protected, and the label
    column when the label is (declared, or estimated with ``private-statistics = "estimate"``).
    """
    columns = list(d.private_columns)
    if d.protected.inputs:
        columns += [c for c in d.public_columns if c not in columns]
    if d.protected.label and d.label_column and d.label_column not in columns:
        columns.append(d.label_column)
    return tuple(columns)


def undeclared_columns(d: DataConfig) -> tuple[str, ...]:
    """:func:`protected_columns` without a declared encoding (``private-ranges`` or
    ``private-categories``, ``public-ranges`` or ``public-categories``, ``label-classes``):
    what ``private-statistics = "estimate"`` releases with charged noise, or else refused.
    """
    declared = {n for n, _, _ in (*d.private_ranges, *d.public_ranges)}
    declared |= {n for n, _ in (*d.private_categories, *d.public_categories)}
    if d.label_classes:
        declared.add(d.label_column)
    return tuple(c for c in protected_columns(d) if c not in declared)
