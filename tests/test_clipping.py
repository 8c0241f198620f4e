"""Tests for fedfdp.clipping.

Reference: an independent per-record loop written here (one autograd.grad per
record, clip, sum), never the code under test.

Tolerances: float64 models, relative error (max |diff| / max |ref|) <= 1e-9 on
the clipped sums and <= 1e-9 on the norms (observed <= 5e-14); float32 models,
<= 1e-4 (observed <= 3e-5; the reference is float32 too).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedfdp.clipping import ClippedSum, clipped_grad_sum, supported_layers

RTOL64 = 1e-9
RTOL32 = 1e-4
N = 7
CLASSES = 3


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one thread is as fast and immune to CPU contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------- #
# reference and helpers
# --------------------------------------------------------------------------- #


def ce_loss(outputs: Sequence[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs[0], y, reduction="none")


def fdp_loss(outputs: Sequence[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    """ce(model(x), y) - ce(model(v), y), per record."""
    return F.cross_entropy(outputs[0], y, reduction="none") - F.cross_entropy(outputs[1], y, reduction="none")


def reference(
    model: nn.Module,
    inputs: list[torch.Tensor],
    y: torch.Tensor,
    loss_fn: Callable,
    max_norm: float | None,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per-record loop: (Σ_i clip(g_i), norms)."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    norms = []
    for i in range(y.shape[0]):
        outs = [model(x[i : i + 1]) for x in inputs]
        loss = loss_fn(outs, y[i : i + 1]).sum()
        raw = torch.autograd.grad(loss, params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for g, p in zip(raw, params, strict=True)]
        norm = math.sqrt(sum(float(g.double().square().sum()) for g in grads))
        norms.append(norm)
        scale = 1.0 if max_norm is None else min(1.0, max_norm / norm) if norm > 0 else 1.0
        for t, g in zip(total, grads, strict=True):
            t += scale * g
    return total, torch.tensor(norms, dtype=torch.float64)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = float(b.abs().max()) if b.numel() else 0.0
    diff = float((a.double() - b.double()).abs().max()) if b.numel() else 0.0
    return diff / scale if scale > 0 else diff


def assert_matches(
    result: ClippedSum,
    ref: tuple[list[torch.Tensor], torch.Tensor],
    rtol: float,
    check_norms: bool = True,
) -> None:
    grads, norms = ref
    assert len(result.grads) == len(grads)
    for got, want in zip(result.grads, grads, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert rel_err(got, want) <= rtol, (result.method, rel_err(got, want))
    if check_norms:
        assert rel_err(result.norms, norms) <= rtol, (result.method, rel_err(result.norms, norms))


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- #
# models covering the supported layers
# --------------------------------------------------------------------------- #


class SeqHead(nn.Module):
    """Linear over 3 positions, then mean-pooled: ghost Gram over K×T positions."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 12)
        self.out = nn.Linear(12, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.fc(x)).mean(1))


class EmbedBag(nn.Module):
    """Embedding (with padding index) + mean over positions + Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(9, 4, padding_idx=0)
        self.fc = nn.Linear(4, CLASSES)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(idx).mean(1))


class SharedTwice(nn.Module):
    """One Linear applied twice in a forward (several calls per layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 5)
        self.out = nn.Linear(5, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.fc(torch.relu(self.fc(x))))


def make_model(name: str) -> tuple[nn.Module, Callable[[torch.Generator], torch.Tensor]]:
    """Model (float64) and a generator of a batch of N inputs."""
    torch.manual_seed(0)
    model: nn.Module
    if name == "mlp":
        model = nn.Sequential(nn.Linear(10, 8), nn.ReLU(inplace=True), nn.Dropout(0.5), nn.Linear(8, CLASSES))

        def gen(g: torch.Generator) -> torch.Tensor:
            return torch.randn(N, 10, generator=g, dtype=torch.float64)

    elif name == "conv1d":
        model = nn.Sequential(
            nn.Conv1d(3, 4, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool1d(2),
            nn.Conv1d(4, 6, 3, stride=2, dilation=2, padding=2, padding_mode="reflect"),
            nn.ReLU(),
            nn.Conv1d(6, 6, 3, groups=3, padding="same"),
            nn.AdaptiveAvgPool1d(2),
            nn.Flatten(),
            nn.Linear(12, CLASSES),
        )

        def gen(g: torch.Generator) -> torch.Tensor:
            return torch.randn(N, 3, 16, generator=g, dtype=torch.float64)

    elif name == "conv2d":
        model = nn.Sequential(
            nn.Conv2d(2, 4, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(4, 16, 2, padding="same", padding_mode="circular"),
            nn.AvgPool2d(2),
            nn.Conv2d(16, 32, 2, groups=2),  # few positions: ghost Gram with groups
            nn.Flatten(),
            nn.Linear(32, CLASSES),
        )

        def gen(g: torch.Generator) -> torch.Tensor:
            return torch.randn(N, 2, 7, 7, generator=g, dtype=torch.float64)

    elif name == "conv_groupnorm":
        # GroupNorm on (n, C, H, W) activations with 1 < groups < C, groups = C
        # (instance-norm-like), groups = 1 (layer-norm-like) and without affine
        # parameters; bias-free, dilated, strided and 1×1 convolutions.
        model = nn.Sequential(
            nn.Conv2d(2, 6, 3, padding=1),
            nn.GroupNorm(3, 6),
            nn.SiLU(),
            nn.Conv2d(6, 8, 3, stride=2, padding=1, bias=False),
            nn.GroupNorm(8, 8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=2, dilation=2),
            nn.GroupNorm(1, 8),
            nn.GELU(),
            nn.Conv2d(8, 4, 1),
            nn.GroupNorm(2, 4, affine=False),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(16, CLASSES),
        )

        def gen(g: torch.Generator) -> torch.Tensor:
            return torch.randn(N, 2, 9, 8, generator=g, dtype=torch.float64)

    elif name == "embedding":
        model = EmbedBag()

        def gen(g: torch.Generator) -> torch.Tensor:
            return torch.randint(0, 9, (N, 5), generator=g)

    elif name == "layernorm":
        model = nn.Sequential(
            nn.Linear(6, 5), nn.LayerNorm(5), nn.GELU(), nn.GroupNorm(1, 5), nn.Linear(5, CLASSES)
        )

        def gen(g: torch.Generator) -> torch.Tensor:
            return torch.randn(N, 6, generator=g, dtype=torch.float64)

    elif name == "sequence":
        model = SeqHead()

        def gen(g: torch.Generator) -> torch.Tensor:
            return torch.randn(N, 3, 12, generator=g, dtype=torch.float64)

    elif name == "shared":
        model = SharedTwice()

        def gen(g: torch.Generator) -> torch.Tensor:
            return torch.randn(N, 5, generator=g, dtype=torch.float64)

    else:  # pragma: no cover
        raise KeyError(name)
    return model.double().eval(), gen


SUPPORTED_MODELS = [
    "mlp",
    "conv1d",
    "conv2d",
    "conv_groupnorm",
    "embedding",
    "layernorm",
    "sequence",
    "shared",
]


def batch(
    gen: Callable[[torch.Generator], torch.Tensor], k: int, seed: int = 1
) -> tuple[list[torch.Tensor], torch.Tensor]:
    g = seeded(seed)
    x = gen(g)
    inputs = [x]
    if k == 2:
        v = gen(g)
        if x.is_floating_point():  # public view: keep the first "column", noise elsewhere
            v.view(N, -1)[:, :1] = x.view(N, -1)[:, :1]
        inputs.append(v)
    y = torch.randint(0, CLASSES, (N,), generator=g)
    return inputs, y


# --------------------------------------------------------------------------- #
# agreement with the per-record loop
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", SUPPORTED_MODELS)
@pytest.mark.parametrize("k", [1, 2])
def test_engines_match_reference(name: str, k: int) -> None:
    model, gen = make_model(name)
    inputs, y = batch(gen, k)
    loss_fn = fdp_loss if k == 2 else ce_loss
    _, norms = reference(model, inputs, y, loss_fn, None)
    sorted_norms = norms.sort().values
    cs = {
        "all-clipped": float(sorted_norms[0]) / 10,
        "some-clipped": float(sorted_norms[N // 2]),
        "none-clipped": float(sorted_norms[-1]) * 10,
    }
    assert 0 < (norms > cs["some-clipped"]).sum() < N
    for c in cs.values():
        ref = reference(model, inputs, y, loss_fn, c)
        for method in ("ghost", "vmap", "loop", "auto"):
            result = clipped_grad_sum(model, inputs, y, loss_fn, c, method=method)
            assert result.method == ("ghost" if method == "auto" else method)
            assert_matches(result, ref, RTOL64)


@pytest.mark.parametrize("name", ["mlp", "conv1d", "conv_groupnorm"])
def test_float32_tolerance(name: str) -> None:
    model, gen = make_model(name)
    model = model.float()
    inputs, y = batch(gen, 2)
    inputs = [x.float() for x in inputs]
    _, norms = reference(model, inputs, y, fdp_loss, None)
    c = float(norms.median())
    ref = reference(model, inputs, y, fdp_loss, c)
    for method in ("ghost", "vmap"):
        result = clipped_grad_sum(model, inputs, y, fdp_loss, c, method=method)
        assert result.grads[0].dtype == torch.float32
        assert_matches(result, ref, RTOL32)


def test_inputs_of_different_shapes_use_separate_forwards() -> None:
    model, _ = make_model("embedding")
    g = seeded(3)
    x = torch.randint(0, 9, (N, 6), generator=g)
    v = torch.randint(0, 9, (N, 2), generator=g)  # shorter public view
    y = torch.randint(0, CLASSES, (N,), generator=g)
    for c in (0.05, 100.0):
        ref = reference(model, [x, v], y, fdp_loss, c)
        for method in ("ghost", "vmap"):
            assert_matches(clipped_grad_sum(model, [x, v], y, fdp_loss, c, method), ref, RTOL64)


def test_sequence_targets_and_loss() -> None:
    """Per-position outputs, loss summed over positions per record (T > 1 in Linear)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, CLASSES)).double()
    g = seeded(4)
    x = torch.randn(N, 5, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (N, 5), generator=g)

    def seq_loss(outputs: Sequence[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs[0].transpose(1, 2), y, reduction="none").sum(1)

    ref = reference(model, [x], y, seq_loss, 0.5)
    for method in ("ghost", "vmap"):
        assert_matches(clipped_grad_sum(model, [x], y, seq_loss, 0.5, method), ref, RTOL64)


class TupleOut(nn.Module):
    """Returns (logits, features), or the logits transposed (record axis last)."""

    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.transposed = transposed
        self.fc = nn.Linear(4, 5)
        self.out = nn.Linear(5, CLASSES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.fc(x))
        logits = self.out(h)
        return (logits.T, h) if self.transposed else (logits, h)


@pytest.mark.parametrize("transposed", [False, True])
def test_structured_outputs(transposed: bool) -> None:
    torch.manual_seed(0)
    model = TupleOut(transposed).double()
    g = seeded(11)
    inputs = [torch.randn(N, 4, generator=g, dtype=torch.float64) for _ in range(2)]
    y = torch.randint(0, CLASSES, (N,), generator=g)

    def loss_fn(outputs: Sequence[tuple[torch.Tensor, torch.Tensor]], y: torch.Tensor) -> torch.Tensor:
        logits = [o[0].T if transposed else o[0] for o in outputs]
        return fdp_loss(logits, y) + 0.1 * outputs[0][1].square().sum(1)

    ref = reference(model, inputs, y, loss_fn, 0.3)
    for method in ("ghost", "vmap"):
        assert_matches(clipped_grad_sum(model, inputs, y, loss_fn, 0.3, method), ref, RTOL64)


# --------------------------------------------------------------------------- #
# properties
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_each_record_clipped_to_c_and_sum_bounded(method: str) -> None:
    model, gen = make_model("conv1d")
    inputs, y = batch(gen, 2)
    c = 1e-3
    full = clipped_grad_sum(model, inputs, y, fdp_loss, c, method)
    assert (full.norms > c).all()
    singles: list[list[torch.Tensor]] = []
    for i in range(N):
        one = clipped_grad_sum(model, [x[i : i + 1] for x in inputs], y[i : i + 1], fdp_loss, c)
        norm = math.sqrt(sum(float(g.square().sum()) for g in one.grads))
        assert norm <= c * (1 + 1e-6)
        singles.append(one.grads)
    # the batch sum is the sum of the single-record clipped gradients
    for j, g in enumerate(full.grads):
        assert rel_err(g, sum((s[j] for s in singles), torch.zeros_like(g))) <= RTOL64
    total = math.sqrt(sum(float(g.square().sum()) for g in full.grads))
    assert total <= N * c * (1 + 1e-6)


def test_unclipped_records_are_untouched() -> None:
    model, gen = make_model("mlp")
    inputs, y = batch(gen, 2)
    plain = clipped_grad_sum(model, inputs, y, fdp_loss, None)
    big = clipped_grad_sum(model, inputs, y, fdp_loss, 1e12, "ghost")
    for a, b in zip(big.grads, plain.grads, strict=True):
        assert rel_err(a, b) <= RTOL64


@pytest.mark.parametrize("method", ["ghost", "vmap", "loop"])
def test_non_finite_record_contributes_nothing(method: str) -> None:
    model, gen = make_model("mlp")
    inputs, y = batch(gen, 2)
    inputs[0] = inputs[0].clone()
    inputs[0][2, 0] = math.nan
    inputs[1] = inputs[1].clone()
    inputs[1][4, 1] = math.inf
    good = [i for i in range(N) if i not in (2, 4)]
    ref = reference(model, [x[good] for x in inputs], y[good], fdp_loss, 0.1)
    result = clipped_grad_sum(model, inputs, y, fdp_loss, 0.1, method)
    assert not math.isfinite(result.norms[2]) and not math.isfinite(result.norms[4])
    assert_matches(result, ref, RTOL64, check_norms=False)
    assert rel_err(result.norms[good], ref[1]) <= RTOL64


@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_dropout_in_training_mode_still_bounded(method: str) -> None:
    model, gen = make_model("mlp")
    model.train()
    inputs, y = batch(gen, 2)
    c = 1e-4
    result = clipped_grad_sum(model, inputs, y, fdp_loss, c, method)
    assert model.training
    total = math.sqrt(sum(float(g.square().sum()) for g in result.grads))
    assert total <= N * c * (1 + 1e-6)


@pytest.mark.parametrize("frozen", ["norm-weight", "norm-bias", "conv-weight", "conv-bias"])
def test_conv_groupnorm_with_frozen_parameters(frozen: str) -> None:
    """Conv2d and GroupNorm with part of their parameters frozen: the ghost
    engine's per-layer norms and sums skip exactly the frozen ones."""
    model, gen = make_model("conv_groupnorm")
    assert isinstance(model, nn.Sequential)
    conv, norm = model[0], model[1]
    {
        "norm-weight": norm.weight,
        "norm-bias": norm.bias,
        "conv-weight": conv.weight,
        "conv-bias": conv.bias,
    }[frozen].requires_grad_(False)
    inputs, y = batch(gen, 2, seed=11)
    _, norms = reference(model, inputs, y, fdp_loss, None)
    c = float(norms.median())
    ref = reference(model, inputs, y, fdp_loss, c)
    result = clipped_grad_sum(model, inputs, y, fdp_loss, c, "auto")
    assert result.method == "ghost"
    assert_matches(result, ref, RTOL64)


# --------------------------------------------------------------------------- #
# fallback to vmap
# --------------------------------------------------------------------------- #


class OwnParameter(nn.Module):
    """A custom module with its own nn.Parameter used in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, CLASSES)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x * self.scale)


class GRUNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(3, 4, batch_first=True)
        self.fc = nn.Linear(4, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.fc(out[:, -1])


class WeightOutsideModule(nn.Module):
    """Uses a supported layer's weight directly (F.linear), bypassing its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.out = nn.Linear(6, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x))
        return self.out(h + F.linear(h, self.fc.weight))


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6, bias=False)
        self.b = nn.Linear(6, 6)
        self.b.weight = self.a.weight
        self.out = nn.Linear(6, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.b(torch.tanh(self.a(x))))


@pytest.mark.parametrize("cls", [OwnParameter, GRUNet, WeightOutsideModule, Tied])
def test_unsupported_models_fall_back_to_vmap(cls: type[nn.Module]) -> None:
    torch.manual_seed(0)
    model = cls().double()
    g = seeded(5)
    shape = (N, 4, 3) if cls is GRUNet else (N, 6)
    inputs = [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(2)]
    y = torch.randint(0, CLASSES, (N,), generator=g)
    _, norms = reference(model, inputs, y, fdp_loss, None)
    c = float(norms.median())
    ref = reference(model, inputs, y, fdp_loss, c)
    result = clipped_grad_sum(model, inputs, y, fdp_loss, c)
    # torch.func cannot vmap nn.GRU (in-place update of its default initial
    # state), so auto goes on to the loop there.
    assert result.method == ("loop" if cls is GRUNet else "vmap")
    assert_matches(result, ref, RTOL64)
    with pytest.raises(ValueError, match="ghost"):
        clipped_grad_sum(model, inputs, y, fdp_loss, c, method="ghost")
    if cls is GRUNet:
        with pytest.raises(ValueError, match="vmap"):
            clipped_grad_sum(model, inputs, y, fdp_loss, c, method="vmap")


def test_batch_first_required_by_ghost() -> None:
    """A layer that sees the records on another axis is detected, not mis-clipped."""

    class SeqFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (n, T, 4)
            return self.fc(x.transpose(0, 1)).mean(0)

    torch.manual_seed(0)
    model = SeqFirst().double()
    x = torch.randn(N, 3, 4, generator=seeded(6), dtype=torch.float64)
    y = torch.randint(0, CLASSES, (N,), generator=seeded(7))
    ref = reference(model, [x], y, ce_loss, 0.1)
    result = clipped_grad_sum(model, [x], y, ce_loss, 0.1)
    assert result.method == "vmap"
    assert_matches(result, ref, RTOL64)


def test_supported_layers() -> None:
    layers = supported_layers()
    for cls in (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding, nn.LayerNorm, nn.GroupNorm):
        assert cls in layers
    assert nn.BatchNorm1d not in layers and nn.GRU not in layers


# --------------------------------------------------------------------------- #
# refusals, edge cases, validation
# --------------------------------------------------------------------------- #


def test_batchnorm_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, CLASSES)).double()
    x = torch.randn(N, 4, dtype=torch.float64, generator=seeded(8))
    y = torch.zeros(N, dtype=torch.long)
    for method in ("auto", "ghost", "vmap", "loop"):
        with pytest.raises(ValueError, match=r"'1'.*BatchNorm1d"):
            clipped_grad_sum(model, [x], y, ce_loss, 1.0, method)
    with pytest.raises(ValueError, match="BatchNorm1d"):
        clipped_grad_sum(model, [x], y, ce_loss, None)
    # in eval mode with running statistics it does not mix records: vmap handles it
    model.eval()
    ref = reference(model, [x], y, ce_loss, 0.1)
    result = clipped_grad_sum(model, [x], y, ce_loss, 0.1)
    assert result.method == "vmap"
    assert_matches(result, ref, RTOL64)
    assert not model.training


@pytest.mark.parametrize("method", ["auto", "ghost", "vmap", "loop"])
def test_empty_batch(method: str) -> None:
    model, _ = make_model("conv1d")
    inputs = [torch.zeros(0, 3, 16, dtype=torch.float64)] * 2
    y = torch.zeros(0, dtype=torch.long)
    result = clipped_grad_sum(model, inputs, y, fdp_loss, 1.0, method)
    assert result.norms.shape == (0,)
    params = [p for p in model.parameters()]
    assert [g.shape for g in result.grads] == [p.shape for p in params]
    assert all(float(g.abs().sum()) == 0 for g in result.grads)


def test_max_norm_none_is_plain_sum() -> None:
    model, gen = make_model("conv2d")
    inputs, y = batch(gen, 2)
    params = list(model.parameters())
    losses = fdp_loss([model(x) for x in inputs], y)
    want = torch.autograd.grad(losses.sum(), params)
    ref_loop = reference(model, inputs, y, fdp_loss, None)
    for method in ("auto", "ghost", "vmap", "loop"):
        result = clipped_grad_sum(model, inputs, y, fdp_loss, None, method)
        assert result.method == "plain"
        assert result.norms.shape == (N,) and torch.isnan(result.norms).all()
        for got, a, b in zip(result.grads, want, ref_loop[0], strict=True):
            assert rel_err(got, a) <= RTOL64 and rel_err(got, b) <= RTOL64


def test_model_state_left_alone() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, CLASSES)).double()
    model[0].bias.requires_grad_(False)  # frozen parameters are skipped
    x = torch.randn(N, 5, dtype=torch.float64, generator=seeded(9))
    y = torch.randint(0, CLASSES, (N,), generator=seeded(9))
    ref = reference(model, [x], y, ce_loss, 0.2)
    for training in (True, False):
        model.train(training)
        for method in ("auto", "ghost", "vmap", "loop"):
            rng = torch.get_rng_state()
            with torch.no_grad():  # the caller's grad mode does not matter
                result = clipped_grad_sum(model, [x], y, ce_loss, 0.2, method)
            assert torch.equal(torch.get_rng_state(), rng)
            assert len(result.grads) == 3
            assert_matches(result, ref, RTOL64)
            assert model.training is training
            assert all(p.grad is None for p in model.parameters())
            for m in model.modules():
                assert not m._forward_hooks and not m._backward_hooks
                assert not m._forward_pre_hooks


def test_no_trainable_parameters() -> None:
    model = nn.Linear(3, CLASSES).double().requires_grad_(False)
    x = torch.randn(N, 3, dtype=torch.float64)
    result = clipped_grad_sum(model, [x], torch.zeros(N, dtype=torch.long), ce_loss, 1.0)
    assert result.grads == [] and result.norms.shape == (N,)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "1.0"])
def test_invalid_max_norm(bad: object) -> None:
    model, gen = make_model("mlp")
    inputs, y = batch(gen, 1)
    with pytest.raises(ValueError, match="max_norm"):
        clipped_grad_sum(model, inputs, y, ce_loss, bad)  # type: ignore[arg-type]


def test_invalid_inputs() -> None:
    model, gen = make_model("mlp")
    (x,), y = batch(gen, 1)
    with pytest.raises(ValueError, match="method"):
        clipped_grad_sum(model, [x], y, ce_loss, 1.0, method="fast")
    with pytest.raises(ValueError, match="inputs"):
        clipped_grad_sum(model, [], y, ce_loss, 1.0)
    with pytest.raises(ValueError, match="inputs"):
        clipped_grad_sum(model, x, y, ce_loss, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="leading sizes"):
        clipped_grad_sum(model, [x, x[:-1]], y, fdp_loss, 1.0)
    with pytest.raises(ValueError, match="leading sizes"):
        clipped_grad_sum(model, [x], y[:-1], ce_loss, 1.0)
    with pytest.raises(ValueError, match="targets"):
        clipped_grad_sum(model, [x], torch.tensor(1), ce_loss, 1.0)

    def mean_loss(outputs: Sequence[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs[0], y)

    for method in ("ghost", "vmap", "loop"):
        with pytest.raises(ValueError, match="reduction='none'"):
            clipped_grad_sum(model, [x], y, mean_loss, 1.0, method)


def test_clip_coefficients_against_definition() -> None:
    from fedfdp.clipping.common import clip_coefficients

    values = [0.0, 1e-30, 0.5, 1.0, 2.0, 3e38, math.inf, math.nan]
    got = clip_coefficients(torch.tensor(values, dtype=torch.float64), 1.5).tolist()
    # min(1, C/x); a zero norm 1, a non-finite norm 0
    want = [1.0 if v == 0 else (min(1.0, 1.5 / v) if math.isfinite(v) else 0.0) for v in values]
    assert got == want
