"""Public surrogate losses and the exact decomposition ``ℓ = ℓ_priv + ℓ_pub``.

Section 5 of the FDP paper rewrites the objective as

    Σ_x ℓ(w; x)  =  Σ_x [ℓ(w; x) − ℓ_pub(w; Ψ(x))]  +  Σ_x ℓ_pub(w; Ψ(x)),

where ``ℓ_pub`` depends on the public features ``Ψ(x)`` only. The first sum
(the *private* loss) is the only part that touches private features; its
per-record gradient is clipped to ``C`` and noised (Algorithm 1, steps 3-4,
Remark 1). The second sum is public and trained without clipping or noise.

Per-record losses here have the signature used by
:func:`fedfdp.clipping.clipped_grad_sum`: ``loss(outputs, targets) -> (n,)``
with ``outputs[k] = model(inputs[k])``.

The seam every engine computes through is :meth:`FeatureMap.terms`: for a batch and
one :class:`LossPart` (``ℓ``, ``ℓ_priv`` or ``ℓ_pub``) it returns the model inputs,
the targets and the per-record loss (:class:`LossTerms`). A classifier's terms read
the labels; a denoising diffusion model's (:class:`fedfdp.images.DiffusionFeatureMap`)
draw each record's timestep and noise from the record's own public stream
(:class:`RecordKeys`) and return the noise as the targets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from fedfdp.config import PublicLoss
from fedfdp.features import FeatureSpec, PublicStatistics, PublicView, column_names

if TYPE_CHECKING:
    from fedfdp.data import FederatedData
    from fedfdp.images.blur import GaussianBlur


def cross_entropy(outputs: Sequence[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    """Full per-record loss ``ℓ(w; x) = CE(model(x), y)`` (input 0)."""
    return F.cross_entropy(outputs[0], targets, reduction="none")


def private_cross_entropy(outputs: Sequence[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    """``ℓ_priv = CE(model(x), y) − CE(model(view), y)`` (inputs 0 and 1).

    With the same view draw, ``private + public == full`` exactly, record by record.
    """
    return F.cross_entropy(outputs[0], targets, reduction="none") - F.cross_entropy(
        outputs[1], targets, reduction="none"
    )


def label_free_private(outputs: Sequence[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    """Label-DP case (``Ψ(x, y) = x``): ``ℓ_priv = CE − logsumexp = −z_y``.

    For softmax regression ``∇ℓ_priv = −x yᵀ``, which is 1-Lipschitz when
    ``‖x‖ ≤ 1`` (Section 5, case study), against √2 for the full loss.
    """
    return -outputs[0].gather(1, targets.view(-1, 1)).squeeze(1)


def label_free_public(outputs: Sequence[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    """Label-free public loss ``ℓ_pub = logsumexp(model(x))``: uses no label."""
    del targets
    return torch.logsumexp(outputs[0], dim=1)


#: A per-record loss ``loss(outputs, targets) -> (n,)`` (``outputs[k] = model(inputs[k])``).
LossFn = Callable[[Sequence[torch.Tensor], torch.Tensor], torch.Tensor]


class LossPart(StrEnum):
    """Which loss a batch is evaluated on: ``ℓ``, ``ℓ_priv = ℓ − ℓ_pub`` or ``ℓ_pub``."""

    FULL = "full"
    PRIVATE = "private"
    PUBLIC = "public"


class LossTerms(NamedTuple):
    """What :func:`fedfdp.clipping.clipped_grad_sum` needs for one part on one batch:
    the model inputs (one tensor per view, a row per record), the targets (a row per
    record) and the per-record loss.
    """

    inputs: list[torch.Tensor]
    targets: torch.Tensor
    loss: LossFn


# spawn-key root of the per-record public draws of the engines (fedfdp.sampling uses
# roots 0 and 1)
_RECORD_ROOT = 2
_PART_KEY = {LossPart.FULL: 0, LossPart.PRIVATE: 1, LossPart.PUBLIC: 2}


@dataclass(frozen=True, eq=False)
class RecordKeys:
    """The public identity of each row of a batch in one round: what a per-record
    public draw is keyed by.

    A record's draw in round ``r`` for part ``p`` comes from its own stream, keyed by
    ``(seed, r, p, device, index)`` — the run's public seed, the round, the loss part
    and the record's global index (its device and its position on the device). It is
    therefore the same whichever batch the record is in and whoever else is in it:
    a Poisson batch with one record more or fewer changes no other record's draw, so
    adding a record changes a clipped sum by that record's term only (sensitivity
    ``C`` under add/remove, Def. 6) for every value of the draws, which need not be
    secret (Theorem 5 holds conditionally on them). A draw shared along the batch
    (one generator consumed record after record) would make each record's draw
    depend on how many records the secret coins put before it. The private and the
    public part have different part keys, so a record drawn into both batches of a
    round gets independent draws, and the public batch's draws never depend on the
    private batch (Prop. 3).

    Rows with ``device = -1`` are the padding rows of a public batch shape
    (:class:`fedfdp.contribution.BatchShape`): ``index`` numbers them; they weigh 0.

    Attributes
    ----------
    seed : int
        The run's public seed (``>= 0``).
    round : int
        The round.
    device, index : torch.Tensor
        ``(n,)`` int64: each row's device and its position on the device.

    Examples
    --------
    >>> a = RecordKeys.of(3, 1, device=2, index=[5, 9])
    >>> b = RecordKeys.of(3, 1, device=2, index=[9])
    >>> g, h = a.generators(LossPart.PRIVATE)[1], b.generators(LossPart.PRIVATE)[0]
    >>> torch.equal(torch.randn(2, generator=g), torch.randn(2, generator=h))
    True
    """

    seed: int
    round: int
    device: torch.Tensor
    index: torch.Tensor

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r}: must be an integer >= 0")
        if self.device.shape != self.index.shape or self.device.dim() != 1:
            raise ValueError(f"record keys: device {tuple(self.device.shape)} and index "
                             f"{tuple(self.index.shape)} must be two (n,) vectors")

    @classmethod
    def of(cls, seed: int, round_: int, device: int, index: Iterable[int] | np.ndarray) -> RecordKeys:
        """The keys of records ``index`` of ``device`` in round ``round_``."""
        idx = torch.as_tensor(np.asarray(index, dtype=np.int64).reshape(-1))
        return cls(int(seed), int(round_), torch.full_like(idx, int(device)), idx)

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def __getitem__(self, rows: slice) -> RecordKeys:
        return RecordKeys(self.seed, self.round, self.device[rows], self.index[rows])

    def padded(self, extra: int) -> RecordKeys:
        """These keys followed by ``extra`` padding rows (``device = -1``)."""
        pad = torch.arange(extra, dtype=torch.int64)
        return RecordKeys(self.seed, self.round, torch.cat([self.device, torch.full_like(pad, -1)]),
                          torch.cat([self.index, pad]))

    def generators(self, part: LossPart | str) -> list[torch.Generator]:
        """One CPU generator per row for its draws in ``part`` (class docstring)."""
        if part not in tuple(LossPart):
            raise ValueError(f"part={part!r}: must be one of {', '.join(LossPart)}")
        head = (_RECORD_ROOT, self.round, _PART_KEY[LossPart(part)])
        gens = []
        for d, i in zip(self.device.tolist(), self.index.tolist(), strict=True):
            seq = np.random.SeedSequence(entropy=self.seed, spawn_key=(*head, d + 1, i))
            state = int(seq.generate_state(1, np.uint64)[0] >> np.uint64(1))
            gens.append(torch.Generator().manual_seed(state))
        return gens


#: A public view: ``view(x, generator) -> x'``, same shape as ``x``, depending on
#: ``Ψ(x)`` only (and on data-independent randomness from ``generator``).
PublicViewFn = Callable[[torch.Tensor, "torch.Generator | None"], torch.Tensor]


@dataclass(frozen=True)
class FeatureMap:
    """The public feature map Ψ and the loss split ``ℓ = ℓ_priv + ℓ_pub`` it induces.

    FDP protects only what Ψ does not disclose. The public loss is the model's
    loss on a *public view* of each record — a full input that depends on
    ``Ψ(x)`` only — and the private loss is the difference, so that
    ``ℓ(w; x) = ℓ_priv(w; x) + ℓ_pub(w; Ψ(x))`` holds record by record
    (Section 5 of the FDP paper). Only ``ℓ_priv`` is clipped and noised
    (Algorithm 1); each record's clipped private gradient has norm ≤ ``C``
    (the add/remove sensitivity, Def. 6).

    Parameters
    ----------
    view : callable or None
        ``view(x, generator) -> x'``: the public view of a batch ``x`` (rows are
        records), same shape, depending only on ``Ψ(x)`` and on the explicit
        generator (e.g. Gaussian padding). A :class:`~fedfdp.features.PublicView`
        for tables, a blur for images, or any user callable. ``None`` selects
        label-DP: ``Ψ(x, y) = x``, ``ℓ_pub = logsumexp(model(x))``.
    spec : FeatureSpec, optional
        The column split, for tables (the view's own spec when ``view`` is a
        :class:`~fedfdp.features.PublicView`; the label-only spec for label-DP).

    Examples
    --------
    >>> import torch
    >>> from fedfdp import FeatureMap
    >>> fmap = FeatureMap.columns(["speed", "heading", "lat", "lon"], private=["lat", "lon"], view="zero")
    >>> fmap.public_inputs(torch.ones(2, 4), None)[0]
    tensor([[1., 1., 0., 0.],
            [1., 1., 0., 0.]])
    >>> blur = FeatureMap(view=lambda x, g: x.mean(dim=1, keepdim=True).expand_as(x))  # a user Ψ
    >>> blur.public_inputs(torch.tensor([[1.0, 3.0]]), None)[0]
    tensor([[2., 2.]])
    """

    view: PublicViewFn | None
    spec: FeatureSpec | None = None
    #: Whether the model is a classifier of the data's records (``model(x)``: one logit
    #: per class) whose targets are the labels; a diffusion model's are not.
    classifier: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.view is not None and not callable(self.view):
            raise ValueError(f"view={self.view!r}: must be a callable view(x, generator) or None")
        own = getattr(self.view, "spec", None)
        if isinstance(self.view, PublicView):
            if self.spec is None:
                object.__setattr__(self, "spec", own)
            elif self.spec != own:
                raise ValueError("FeatureMap: spec differs from the view's spec")
        if self.view is None and self.spec is not None and not self.spec.is_label_only:
            raise ValueError(
                f"label-free decomposition with spec private={list(self.spec.private)}: the "
                "label-free loss reads every column, so no column can stay private"
            )

    @classmethod
    def columns(
        cls,
        columns: Sequence[str],
        private: Sequence[str],
        *,
        view: str = "gaussian",
        statistics: Sequence[float] | None = None,
    ) -> FeatureMap:
        """Tables: ``private`` columns are protected, the others are Ψ (public).

        ``view``: ``gaussian`` (private columns replaced by N(0, 1) draws),
        ``zero`` (masked) or ``mean`` (replaced by ``statistics``, one public
        constant per private column — never computed from the private data).
        """
        columns = column_names("columns", columns)
        private = column_names("private", private)
        unknown = [c for c in private if c not in columns]
        if unknown:
            raise ValueError(f"private={list(private)}: unknown column(s) {unknown}")
        spec = FeatureSpec(columns, tuple(c for c in columns if c not in private), private)
        stats = PublicStatistics.from_public(spec, statistics) if statistics is not None else None
        return cls(PublicView(spec, view, stats))

    @classmethod
    def label_dp(cls, columns: Sequence[str]) -> FeatureMap:
        """Label-DP (``Ψ(x, y) = x``): ``ℓ_pub = logsumexp(z)``, ``ℓ_priv = −z_y``.

        Every input column is disclosed; only the label is protected. For
        softmax regression ``∇_W ℓ_priv = −y xᵀ`` (one-hot ``y``), so a record's
        private gradient has norm ``‖x‖`` (``√(‖x‖² + 1)`` with a bias), against
        up to ``√2·‖x‖`` for the full cross-entropy used by DP-SGD.
        """
        return cls(None, FeatureSpec.label_only(column_names("columns", columns)))

    def check(self, x: torch.Tensor) -> None:
        """Refuse a view that changes the batch's shape or dtype (one line naming both)."""
        if self.view is None or len(x) == 0:
            return
        out = self.view(x[:1], torch.Generator().manual_seed(0))
        if not isinstance(out, torch.Tensor) or out.shape != x[:1].shape or out.dtype != x.dtype:
            got = (tuple(out.shape), out.dtype) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(
                f"feature map view: returned {got} for input {(tuple(x[:1].shape), x.dtype)}; a public "
                "view must keep the batch's shape and dtype"
            )

    @property
    def label_free(self) -> bool:
        """True for the label-DP decomposition."""
        return self.view is None

    def private_inputs(self, x: torch.Tensor, generator: torch.Generator | None) -> list[torch.Tensor]:
        """Inputs on which ``ℓ_priv`` evaluates the model: ``[x, view(x)]``."""
        if self.view is None:
            return [x]
        return [x, self.view(x, generator)]

    def public_inputs(self, x: torch.Tensor, generator: torch.Generator | None) -> list[torch.Tensor]:
        """Inputs on which ``ℓ_pub`` evaluates the model: ``[view(x)]``."""
        if self.view is None:
            return [x]
        return [self.view(x, generator)]

    def private_loss(self, outputs: Sequence[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        """Per-record ``ℓ_priv``."""
        if self.view is None:
            return label_free_private(outputs, targets)
        return private_cross_entropy(outputs, targets)

    def public_loss(self, outputs: Sequence[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        """Per-record ``ℓ_pub`` on the view."""
        if self.view is None:
            return label_free_public(outputs, targets)
        return cross_entropy(outputs, targets)

    def terms(
        self,
        part: LossPart,
        x: torch.Tensor,
        y: torch.Tensor,
        generator: torch.Generator | None,
        keys: RecordKeys | None = None,
    ) -> LossTerms:
        """The inputs, targets and per-record loss of ``part`` on the batch ``(x, y)``:
        the seam every engine computes ``ℓ``, ``ℓ_priv`` and ``ℓ_pub`` through.

        ``full``: ``[x]``, ``y``, cross-entropy; ``private``: :meth:`private_inputs`,
        ``y``, :meth:`private_loss`; ``public``: :meth:`public_inputs`, ``y``,
        :meth:`public_loss`. The views draw from ``generator`` (the batch's padding
        stream); ``keys`` (each row's public identity, :class:`RecordKeys`) are for
        decompositions that draw per record, and unused here.
        """
        del keys
        if part == LossPart.FULL:
            return LossTerms([x], y, cross_entropy)
        if part == LossPart.PRIVATE:
            return LossTerms(self.private_inputs(x, generator), y, self.private_loss)
        if part == LossPart.PUBLIC:
            return LossTerms(self.public_inputs(x, generator), y, self.public_loss)
        raise ValueError(f"part={part!r}: must be one of {', '.join(LossPart)}")


@dataclass(frozen=True)
class BlurSettings:
    """Ψ of an image dataset: an odd ``kernel`` of pixels, standard deviation ``sigma``,
    quantised to ``levels`` grey levels (0: the exact blur, which is invertible).
    """

    kernel: int = 9
    sigma: float = 2.0
    levels: int = 256


def image_view(data: FederatedData, public_loss: PublicLoss, blur: BlurSettings) -> GaussianBlur:
    """Ψ of an image dataset: :class:`fedfdp.images.GaussianBlur` of ``blur`` (the
    ``blur-*`` keys).

    Raises
    ------
    ValueError
        ``public-loss`` other than ``auto``, or a kernel whose radius reaches the image
        size (reflect padding), in one line naming the key and the value.
    """
    from fedfdp.images.blur import GaussianBlur

    if public_loss is not PublicLoss.AUTO:
        raise ValueError(
            f"public-loss={public_loss!r}: dataset {data.name!r} holds images, whose public "
            "view is the blur (blur-kernel, blur-sigma, blur-levels); leave public-loss = 'auto'"
        )
    shape = data.image_shape or (0, 0, 0)
    if blur.kernel // 2 >= min(shape[1:]):
        raise ValueError(
            f"blur-kernel={blur.kernel}: its radius {blur.kernel // 2} must be below the image size "
            f"{shape[1]}×{shape[2]} (reflect padding)"
        )
    return GaussianBlur(blur.kernel, blur.sigma, levels=blur.levels or None)


def build_decomposition(
    data: FederatedData,
    public_loss: PublicLoss = PublicLoss.AUTO,
    *,
    model: str = "logistic",
    blur: BlurSettings = BlurSettings(),
) -> FeatureMap:
    """The (ℓ_priv, ℓ_pub) pair of ``public_loss`` for ``data`` (a run's is
    :func:`fedfdp.run_plan.feature_map_for`: the configured ``public-loss``, ``model``
    and ``blur-*`` keys).

    ``public_loss = "label-free"`` selects label-DP: ``Ψ(x, y) = x`` replaces
    the dataset's own split (every input column becomes public, the label
    private) and ``ℓ_pub = logsumexp(wᵀx)`` (paper, Section 5); it needs
    ``model = "logistic"``.

    Image datasets (``data.is_image``): the view is the Gaussian blur ``blur``
    (0 levels: the exact blur), ``ℓ_pub = CE(model(blur(x)), y)``, the label public.
    (``model = "ddpm"``: :func:`fedfdp.run_plan.feature_map_for` builds the diffusion
    split, :class:`fedfdp.images.DiffusionFeatureMap`, over the same blur.)
    """
    if data.is_image:
        return FeatureMap(image_view(data, public_loss, blur))
    if data.spec is None:  # a table always has a spec (FederatedData.__post_init__)
        raise RuntimeError(f"dataset {data.name!r}: no feature spec")
    method = public_loss
    if method is PublicLoss.AUTO:
        try:
            method = PublicLoss(data.public_loss)
        except ValueError:
            raise ValueError(
                f"dataset {data.name!r}: public_loss={data.public_loss!r} is not a table's public loss "
                f"(one of {', '.join(k.value for k in PublicLoss if k is not PublicLoss.AUTO)})"
            ) from None
    if method == PublicLoss.LABEL_FREE:
        if model != "logistic":
            raise ValueError(f"public-loss='label-free': needs model='logistic', got {model!r}")
        return FeatureMap.label_dp(data.spec.columns)
    stats = data.public_statistics if method == PublicLoss.MEAN else None
    if method == PublicLoss.MEAN and stats is None:
        raise ValueError(f"public-loss='mean': dataset {data.name!r} declares no public statistics")
    return FeatureMap(PublicView(data.spec, method, stats))
