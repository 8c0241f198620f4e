"""Tests for fedfdp.images.train: the five methods, end to end, in seconds.

Independent references: the project's accountant and calibration (called here
directly), a counting bit stream for what the secret stream is used for, and a
hand-computed DP-SGD step (clipped sum through the per-record loop + the noise
drawn from an identically seeded stream, divided by qN).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedfdp.accounting import calibrate_noise_multiplier, epsilon_for
from fedfdp.clipping import ClipMethod, clipped_grad_sum
from fedfdp.config import Mode, Optimizer
from fedfdp.entropy import SeededBits
from fedfdp.images.blur import GaussianBlur
from fedfdp.images.data import ImageSet, ImageShape
from fedfdp.images.diffusion import DiffusionLoss, NoiseSchedule
from fedfdp.images.models import build_classifier
from fedfdp.images.train import (
    METHODS,
    ClassificationTask,
    DiffusionTask,
    LossPart,
    TrainSettings,
    evaluate_classifier,
    train,
)
from fedfdp.images.unet import build_unet
from fedfdp.losses import cross_entropy
from fedfdp.mechanisms import GaussianSumMechanism
from fedfdp.sampling import poisson_sample


@pytest.fixture(autouse=True, scope="module")
def _threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def digits() -> tuple[ImageSet, ImageSet]:
    pytest.importorskip("sklearn")
    from fedfdp.images.data import load_digits8, split_images

    fed = split_images(load_digits8(), 1, test_fraction=0.2, seed=0)
    train_set = fed.train()
    small = ImageSet("digits-small", train_set.x[:240], train_set.y[:240], train_set.class_names)
    return small, fed.test()


def _secrets(seed: int = 0) -> SeededBits:
    return SeededBits(np.random.SeedSequence(seed))


class CountingBits:
    """A seeded bit stream that records how many words each call asks for."""

    def __init__(self, seed: int) -> None:
        self.inner = _secrets(seed)
        self.calls: list[int] = []

    def words(self, n: int) -> np.ndarray:
        self.calls.append(n)
        return self.inner.words(n)


def _metric(row: dict[str, float | int | str], key: str) -> float:
    """The metric ``key`` of a history row (what ``evaluate`` returned); fails the test if
    it is not a float."""
    value = row[key]
    assert isinstance(value, float), (key, value)
    return value


@pytest.mark.parametrize("method", METHODS)
def test_classifier_every_method_runs_and_reports_epsilon(digits, method: Mode) -> None:
    data, test = digits
    model = build_classifier(data.shape, 10, width=8, features=16, generator=torch.Generator().manual_seed(0))
    before = [p.detach().clone() for p in model.parameters()]
    settings = TrainSettings(
        method=method,
        steps=4,
        sampling_rate=0.1,
        target_epsilon=8.0,
        pretrain_steps=2,
        public_batch_size=32,
        learning_rate=0.05,
        eval_every=2,
    )
    result = train(
        model,
        ClassificationTask(GaussianBlur(3, 1.0)),
        data,
        settings,
        evaluate=lambda m: evaluate_classifier(m, test),
        secrets=_secrets(),
    )
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert result.history[-1]["phase"] == "final" and 0 <= _metric(result.history[-1], "accuracy") <= 1
    assert result.reproducible_secrets and result.delta == pytest.approx(1 / (2 * 240))
    if method == "nonprivate":
        assert result.epsilon == math.inf and result.noise_multiplier is None
    elif method == "public":
        assert result.epsilon == 0.0 and result.noise_multiplier is None
    else:
        sigma = calibrate_noise_multiplier(target_epsilon=8.0, sampling_rate=0.1, rounds=4, delta=1 / 480)
        # the accounted σ (fdp's default recipe gives the gradient σ/√(1 − r), the count the rest)
        assert result.accounted_noise_multiplier == pytest.approx(sigma)
        assert result.epsilon == pytest.approx(epsilon_for(sigma, 0.1, 4, 1 / 480).upper)
        assert result.epsilon <= 8.0
    summary = result.summary()
    assert summary["epsilon_relation"] == "add-remove (upper bound)" and "model" not in summary


@pytest.mark.parametrize("method", [Mode.DP, Mode.FDP])
def test_secret_stream_only_feeds_coins_and_noise(digits, method: Mode) -> None:
    """Per private step the secret stream gives N coin words and the noise words (for
    ``fdp``'s default recipe also the count's noise, one normal), nothing else: the public
    batch of Algorithm 1 is drawn independently (Prop. 3)."""
    data, _ = digits
    model = build_classifier(data.shape, 10, width=4, features=8, generator=torch.Generator().manual_seed(0))
    d = sum(p.numel() for p in model.parameters())
    bits = CountingBits(1)
    settings = TrainSettings(
        method=method,
        steps=3,
        sampling_rate=0.2,
        noise_multiplier=1.0,
        public_batch_size=16,
        pretrain_steps=2,
    )
    train(model, ClassificationTask(GaussianBlur(3, 1.0)), data, settings, secrets=bits)
    noise_words = 2 * ((4 * d + 1) // 2)  # 4 Box–Muller summands per coordinate, pairs of uniforms
    count_words = [2 * ((4 + 1) // 2)] if method is Mode.FDP else []
    assert bits.calls == [len(data), noise_words, *count_words] * 3


def test_dp_step_equals_a_hand_computed_step(digits) -> None:
    """One DP-SGD step with plain SGD: w' = w − lr · (Σ clip(g_i) + N(0, σ²C²)) / (qN)."""
    data, _ = digits
    gen = torch.Generator().manual_seed(3)
    model = build_classifier(data.shape, 10, width=4, features=8, generator=gen).double()
    start = [p.detach().clone() for p in model.parameters()]
    x, y = data.tensors()
    x = x.double()
    q, c, sigma, lr = 0.25, 0.5, 0.7, 0.3
    # reference: same secret stream, per-record loop, project mechanism
    ref_bits = _secrets(7)
    idx = torch.as_tensor(poisson_sample(len(data), q, ref_bits))
    clipped = clipped_grad_sum(model, [x[idx]], y[idx], cross_entropy, c, "loop").grads
    noisy = GaussianSumMechanism(sigma, c).privatize(clipped, ref_bits)
    expected = [w - lr * g / (q * len(data)) for w, g in zip(start, noisy, strict=True)]
    double_data = ImageSet("d", np.array(data.x), np.array(data.y), data.class_names)
    settings = TrainSettings(
        method=Mode.DP,
        steps=1,
        sampling_rate=q,
        clipping_norm=c,
        noise_multiplier=sigma,
        learning_rate=lr,
        momentum=0.0,
        clip_method=ClipMethod.GHOST,
        chunk_size=1000,
    )

    class Double(ClassificationTask):
        def parts(self, part, xb, yb, generator):
            return super().parts(part, xb.double(), yb, generator)

    train(model, Double(GaussianBlur(3, 1.0)), double_data, settings, secrets=_secrets(7))
    for got, want in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-9, atol=1e-12)


def test_diffusion_end_to_end_in_seconds(digits) -> None:
    """A few steps of every method on a tiny U-Net and 8×8 digits: finite losses,
    parameters move, and non-private training lowers the loss on held-out digits."""
    data, test = digits
    sched = NoiseSchedule(100, "cosine")
    task = DiffusionTask(DiffusionLoss(sched, GaussianBlur(3, 1.0), 10))
    xt, yt = test.tensors()

    def held_out_loss(model: torch.nn.Module) -> dict[str, float]:
        gens = [torch.Generator().manual_seed(123 + i) for i in range(100)]
        with torch.no_grad():
            inputs, targets, loss_fn = task.parts(LossPart.FULL, xt[:100], yt[:100], gens)
            return {"loss": float(loss_fn([model(v) for v in inputs], targets).mean())}

    shape = ImageShape(1, 8, 8)
    for method in METHODS:
        model = build_unet(
            shape, 10, base=8, mults=(1, 2), groups=4, generator=torch.Generator().manual_seed(0)
        )
        settings = TrainSettings(
            method=method,
            steps=15 if method == "nonprivate" else 2,
            sampling_rate=0.1,
            noise_multiplier=1.0,
            clipping_norm=1.0,
            pretrain_steps=2,
            public_batch_size=24,
            learning_rate=2e-3,
            optimizer=Optimizer.ADAM,
        )
        first = held_out_loss(model)["loss"]
        result = train(model, task, data, settings, evaluate=held_out_loss, secrets=_secrets(2))
        last = _metric(result.history[-1], "loss")
        assert math.isfinite(last)
        if method == "nonprivate":
            assert last < first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", [Mode.NONPRIVATE, Mode.DP, Mode.FDP])
def test_cuda_run_matches_the_cpu_run(digits, method: Mode) -> None:
    """The same run (float64, plain SGD, identically seeded secret stream) on the CPU
    and on CUDA: the secret stream is asked for the same words (coins and noise
    only, drawn on the CPU), the model stays on its device and ends at the same
    parameters up to float64 reduction-order differences (rtol 1e-7)."""
    data, _ = digits
    shape = ImageShape(1, 8, 8)

    class Double(DiffusionTask):
        def parts(self, part, xb, yb, generators):
            return super().parts(part, xb.double(), yb, generators)

    task = Double(DiffusionLoss(NoiseSchedule(100, "linear"), GaussianBlur(3, 1.0), 10))
    settings = TrainSettings(
        method=method,
        steps=3,
        sampling_rate=0.2,
        noise_multiplier=1.0,
        clipping_norm=0.5,
        pretrain_steps=2,
        public_batch_size=16,
        learning_rate=0.05,
        momentum=0.0,
        seed=4,
    )
    ends, calls = [], []
    for device in ("cpu", "cuda"):
        model = build_unet(
            shape, 10, base=8, mults=(1, 2), groups=4, generator=torch.Generator().manual_seed(0)
        ).double()
        model.to(device)
        bits = CountingBits(9)
        train(model, task, data, settings, secrets=bits)
        assert all(p.device.type == device for p in model.parameters())
        ends.append([p.detach().cpu() for p in model.parameters()])
        calls.append(bits.calls)
    assert calls[0] == calls[1]
    for got, want in zip(ends[1], ends[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"method": "dpsgd"}, r"mode='dpsgd'"),
        ({"steps": 0}, r"steps=0"),
        ({"sampling_rate": 0.0}, r"sampling-rate=0\.0"),
        ({"clipping_norm": -1.0}, r"clipping_norm=-1\.0"),
        ({"noise_multiplier": 0.0}, r"noise-multiplier=0\.0"),
        ({"delta": 1.0}, r"delta=1\.0"),
        ({"optimizer": "rmsprop"}, r"optimizer='rmsprop'"),
        ({"clip_method": "fast"}, r"clip_method='fast'"),
        ({"pretrain_steps": -1}, r"pretrain_steps=-1"),
    ],
)
def test_settings_refusals(kwargs, match) -> None:
    base = {"method": "fdp", "steps": 10, "sampling_rate": 0.1}
    with pytest.raises(ValueError, match=match):
        TrainSettings(**{**base, **kwargs})
