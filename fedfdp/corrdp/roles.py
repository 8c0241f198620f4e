"""Which model inputs are sensitive, which are insensitive, and how much each
insensitive feature reveals about the sensitive ones (its TV).

The CorrDP neighbouring relation (Def. 2.1 and Assumption 3.1 of the CorrDP paper,
Wang, Zhang, Cummings, arXiv:2605.03945): two datasets are neighbours when one record ``e`` is
replaced by ``e'`` that differs from it **only in its sensitive features, or only in
one insensitive feature**; the label is the same. A change of sensitive features
must be ``(ε, δ)``-indistinguishable; a change of insensitive feature ``j`` only
``(ε / TV(j), δ)``-indistinguishable (Def. 2.2 with ``d(D, D') = TV(j)``; see
``docs/corrdp.md`` §1 for why the exponent is ``ε / d``), and not constrained at all
when ``TV(j) = 0``.

``TV(j)`` (Def. 2.7) is ``max_{x1, x2} TV(P_{X^S | x_j = x1}, P_{X^S | x_j = x2})``:
how far apart the conditional laws of the sensitive features can be for two values
of feature ``j``. It is either declared (domain knowledge, the paper's preferred
case) or estimated (:mod:`fedfdp.corrdp.tv`).

A *feature* may span several model input columns (e.g. a one-hot encoding); an
insensitive feature's change changes all of its columns together. Every input column
is either sensitive or belongs to exactly one insensitive feature.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fedfdp.accounting.events import Relation

#: The name under which every CorrDP ε is reported (never "dp" or "fdp").
RELATION = Relation.CORRDP


def check_tv(name: str, tv: object) -> float:
    """``tv`` as a float in ``[0, 1]``; otherwise ValueError naming the feature and value.

    Examples
    --------
    >>> check_tv("speed", 0.25)
    0.25
    >>> check_tv("speed", 1.5)
    Traceback (most recent call last):
    ...
    ValueError: insensitive feature 'speed': tv=1.5 must be in [0, 1]
    """
    if isinstance(tv, bool) or not isinstance(tv, numbers.Real):
        raise ValueError(f"insensitive feature {name!r}: tv={tv!r} must be a number in [0, 1]")
    value = float(tv)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"insensitive feature {name!r}: tv={tv!r} must be in [0, 1]")
    return value


@dataclass(frozen=True)
class InsensitiveFeature:
    """One insensitive feature: its name, its model input columns and its TV.

    Parameters
    ----------
    name : str
    columns : tuple of int
        Model input columns holding the feature (one for a numeric column).
    tv : float
        ``TV(j)`` of Def. 2.7, in ``[0, 1]`` (declared, or the inflated estimate
        ``TṼ(j)`` of Def. 3.10).

    Examples
    --------
    >>> InsensitiveFeature("kind", (2, 3), 0.5)
    InsensitiveFeature(name='kind', columns=(2, 3), tv=0.5)
    """

    name: str
    columns: tuple[int, ...]
    tv: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"insensitive feature name={self.name!r}: must be a non-empty string")
        cols = tuple(self.columns)
        if not cols:
            raise ValueError(f"insensitive feature {self.name!r}: needs at least one input column")
        for c in cols:
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise ValueError(f"insensitive feature {self.name!r}: column {c!r} must be an integer >= 0")
        if len(set(cols)) != len(cols):
            raise ValueError(f"insensitive feature {self.name!r}: columns {cols} repeat a column")
        object.__setattr__(self, "columns", cols)
        object.__setattr__(self, "tv", check_tv(self.name, self.tv))


@dataclass(frozen=True)
class FeatureRoles:
    """The split of a model's input columns into sensitive ones and insensitive features.

    Parameters
    ----------
    num_inputs : int
        ``m``, the model's input width.
    sensitive : tuple of int
        The sensitive input columns ``S`` (``m_s = len(sensitive)``).
    insensitive : tuple of InsensitiveFeature
        The insensitive features; their columns and ``S`` partition ``range(m)``.
    names : tuple of str, optional
        Input column names (for messages only).

    Raises
    ------
    ValueError
        A column out of range, declared twice (sensitive and insensitive, or in two
        insensitive features), or not declared at all; a TV outside ``[0, 1]``;
        duplicate feature names. The message names the column or value.

    Examples
    --------
    >>> feats = (InsensitiveFeature("speed", (1,), 0.4), InsensitiveFeature("hour", (2,), 0.1))
    >>> roles = FeatureRoles(3, (0,), feats)
    >>> roles.num_sensitive, roles.tv
    (1, {'speed': 0.4, 'hour': 0.1})
    >>> FeatureRoles(2, (0, 1), (InsensitiveFeature("speed", (1,), 0.4),))
    Traceback (most recent call last):
    ...
    ValueError: column 1 is declared both sensitive and insensitive feature 'speed'
    """

    num_inputs: int
    sensitive: tuple[int, ...]
    insensitive: tuple[InsensitiveFeature, ...]
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        m = self.num_inputs
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"num_inputs={m!r}: must be an integer >= 1")
        names = tuple(self.names)
        if names and len(names) != m:
            raise ValueError(f"names: {len(names)} names for {m} input columns")
        object.__setattr__(self, "names", names)
        label = (lambda c: f"{c} ({names[c]!r})") if names else str
        sensitive = tuple(self.sensitive)
        object.__setattr__(self, "sensitive", sensitive)
        object.__setattr__(self, "insensitive", tuple(self.insensitive))
        owner: dict[int, str] = {}
        for c in sensitive:
            if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < m:
                raise ValueError(f"sensitive column {c!r}: must be an integer in [0, {m})")
            if c in owner:
                raise ValueError(f"column {label(c)} is declared sensitive twice")
            owner[c] = "sensitive"
        seen: set[str] = set()
        for feat in self.insensitive:
            if not isinstance(feat, InsensitiveFeature):
                raise ValueError(f"insensitive: {feat!r} is not an InsensitiveFeature")
            if feat.name in seen:
                raise ValueError(f"insensitive feature {feat.name!r} is declared twice")
            seen.add(feat.name)
            for c in feat.columns:
                if not c < m:
                    raise ValueError(f"insensitive feature {feat.name!r}: column {c} out of range [0, {m})")
                if c in owner:
                    what = "sensitive" if owner[c] == "sensitive" else f"insensitive feature {owner[c]!r}"
                    raise ValueError(
                        f"column {label(c)} is declared both {what} and insensitive feature {feat.name!r}"
                    )
                owner[c] = feat.name
        missing = [c for c in range(m) if c not in owner]
        if missing:
            shown = ", ".join(label(c) for c in missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ValueError(f"columns {shown}: neither sensitive nor insensitive (declare every column)")

    # ------------------------------------------------------------------ views
    @property
    def num_sensitive(self) -> int:
        """``m_s``."""
        return len(self.sensitive)

    @property
    def tv(self) -> dict[str, float]:
        """``{feature name: TV}``."""
        return {f.name: f.tv for f in self.insensitive}

    def with_tv(self, tv: Mapping[str, float]) -> FeatureRoles:
        """The same split with the TVs in ``tv`` (e.g. estimated ones) replacing the declared."""
        unknown = sorted(set(tv) - {f.name for f in self.insensitive})
        if unknown:
            raise ValueError(f"tv for unknown insensitive features {unknown}")
        feats = tuple(InsensitiveFeature(f.name, f.columns, tv.get(f.name, f.tv)) for f in self.insensitive)
        return FeatureRoles(self.num_inputs, self.sensitive, feats, self.names)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_names(
        cls,
        columns: Sequence[str],
        sensitive: Sequence[str],
        tv: Mapping[str, float],
        groups: Mapping[str, Sequence[str]] | None = None,
    ) -> FeatureRoles:
        """Roles from column names.

        Parameters
        ----------
        columns : sequence of str
            The model's input column names, in order.
        sensitive : sequence of str
            Sensitive column names.
        tv : mapping
            ``{insensitive feature: TV}``. A feature is one column of that name unless
            ``groups`` lists its columns (e.g. the columns of a one-hot encoding).
        groups : mapping, optional
            ``{insensitive feature: its column names}``.

        Examples
        --------
        >>> roles = FeatureRoles.from_names(["hr", "speed", "hour"], ["hr"], {"speed": 0.4, "hour": 0.1})
        >>> roles.sensitive, roles.tv
        ((0,), {'speed': 0.4, 'hour': 0.1})
        """
        cols = tuple(columns)
        index = {c: i for i, c in enumerate(cols)}
        if len(index) != len(cols):
            raise ValueError(f"columns {cols}: names repeat")

        def position(name: str, what: str) -> int:
            if name not in index:
                raise ValueError(f"{what} column {name!r}: not an input column")
            return index[name]

        groups = dict(groups or {})
        unknown = sorted(set(groups) - set(tv))
        if unknown:
            raise ValueError(f"groups for features without a tv: {unknown}")
        feats = tuple(
            InsensitiveFeature(
                name,
                tuple(position(c, f"insensitive feature {name!r}:") for c in groups.get(name, (name,))),
                value,
            )
            for name, value in tv.items()
        )
        return cls(len(cols), tuple(position(s, "sensitive") for s in sensitive), feats, cols)
