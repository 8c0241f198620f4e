"""The image trainer's public randomness does not depend on the private batch.

Issue 22, item 3. The reference trainer (:mod:`fedfdp.images.train`) used one
public generator for the diffusion draws ``(t, ε)`` of the private Poisson
batch and then of the public batch. The public gradient, released without
noise inside the update, then depended on ``|B_t|``: an adversary who knows the
seed replays the generator for every candidate size and reads ``|B_t|`` off the
public gradient. Now every public draw comes from a stream keyed by public
quantities only (:class:`fedfdp.images.train.PublicDraws`).

The tests:

* exact: the public batch, the records' draws and the packed public inputs of
  every step are bit-identical between two runs with the same seed and
  different private batch sizes (diffusion; and classification with a Ψ that
  draws random values);
* the replay attack, re-implemented: against a local reproduction of the old
  draw order (here, not in production) it recovers ``|B_t|`` in every trial
  (replay residual exactly 0 at the true size, > 0 elsewhere); against the real
  trainer every candidate size reproduces the released public gradient exactly
  (residual spread 0), so the adversary can do no better than guess from the
  prior: its success count stays within the 99.9% quantile of the binomial of
  guessing the prior's mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from fedfdp.entropy import SeededBits
from fedfdp.images.blur import GaussianBlur, check_public_map
from fedfdp.images.data import ImageSet, ImageShape
from fedfdp.images.diffusion import DiffusionLoss, NoiseSchedule, draw_noise
from fedfdp.images.recipe import FIXED_CLIPPING
from fedfdp.images.train import (
    ClassificationTask,
    DiffusionTask,
    LossPart,
    PublicDraws,
    Stage,
    TrainSettings,
    train,
)
from fedfdp.sampling import uniform_sample

SHAPE = ImageShape(1, 8, 8)
N, Q, M_PUB, SEED = 40, 0.1, 8, 11
CHUNK = 16


@pytest.fixture(autouse=True, scope="module")
def _threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _images(n: int = N, seed: int = 0) -> ImageSet:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand((n, *SHAPE.as_tuple()), generator=g).numpy()
    y = torch.randint(0, 10, (n,), generator=g).numpy()
    return ImageSet("synthetic", x, y, tuple(str(k) for k in range(10)))


def _loss() -> DiffusionLoss:
    return DiffusionLoss(NoiseSchedule(100, "cosine"), GaussianBlur(3, 1.0), 10)


def _init(model: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def _denoiser(seed: int = 0) -> nn.Module:
    """A tiny noise predictor on packed inputs ``(n, C·H·W + 2)`` → ``(n, C, H, W)``."""
    pixels = SHAPE.channels * SHAPE.height * SHAPE.width
    return _init(nn.Sequential(nn.Linear(pixels + 2, pixels), nn.Unflatten(1, SHAPE.as_tuple())), seed)


def _classifier(seed: int = 0) -> nn.Module:
    return _init(nn.Sequential(nn.Flatten(), nn.Linear(SHAPE.height * SHAPE.width, 10)), seed)


class ForcedCoins:
    """A secret stream whose coin requests (the trainer asks for the coins, then the
    noise, once per private step) select exactly the first ``size`` records; the
    noise from a seeded stream."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.inner = SeededBits(np.random.SeedSequence(seed))
        self.requests = 0

    def words(self, n: int) -> np.ndarray:
        self.requests += 1
        if self.requests % 2 == 0:
            return self.inner.words(n)
        words = np.full(n, np.iinfo(np.uint64).max, dtype=np.uint64)  # uniform ≈ 1: out
        words[: self.size] = 0  # uniform ≈ 0: in
        return words


@dataclass
class Recording:
    """Wraps a task; records what each part was asked for and returned."""

    inner: DiffusionTask | ClassificationTask
    calls: list[tuple[LossPart, torch.Tensor, list[torch.Tensor], torch.Tensor]] = field(default_factory=list)

    def parts(self, part, x, y, generators):
        inputs, targets, loss_fn = self.inner.parts(part, x, y, generators)
        self.calls.append((LossPart(part), x.clone(), [t.detach().clone() for t in inputs],
                           targets.detach().clone()))
        return inputs, targets, loss_fn

    def of(self, part: LossPart) -> list[tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]]:
        return [(x, inputs, targets) for p, x, inputs, targets in self.calls if p is part]


def _settings(**kw) -> TrainSettings:
    base = dict(method="fdp", steps=3, sampling_rate=Q, noise_multiplier=1.0, clipping_norm=1.0,
                public_batch_size=M_PUB, pretrain_steps=1, learning_rate=1e-2, momentum=0.0,
                clip_method="vmap", chunk_size=CHUNK, seed=SEED,
                recipe=FIXED_CLIPPING)  # FixedSize alternates coins and noise: no count's noise
    return TrainSettings(**{**base, **kw})


# --------------------------------------------------------------------------------------
# the keyed streams
# --------------------------------------------------------------------------------------


def test_a_records_draws_do_not_depend_on_its_batch() -> None:
    """A record's generator depends on (stage, step, part, index) only; each key its own stream."""
    draws = PublicDraws(5)

    def first_normal(stage, step, part, index, which):
        gens = draws.record_generators(stage, step, part, np.array(index))
        return torch.randn(4, generator=gens[which])

    alone = first_normal(Stage.MAIN, 2, LossPart.PUBLIC, [7], 0)
    assert torch.equal(alone, first_normal(Stage.MAIN, 2, LossPart.PUBLIC, [3, 7, 30], 1))
    assert torch.equal(alone, first_normal(Stage.MAIN, 2, LossPart.PUBLIC, list(range(40)), 7))
    others = [first_normal(Stage.MAIN, 2, LossPart.PRIVATE, [7], 0),
              first_normal(Stage.MAIN, 3, LossPart.PUBLIC, [7], 0),
              first_normal(Stage.PRETRAIN, 2, LossPart.PUBLIC, [7], 0),
              first_normal(Stage.MAIN, 2, LossPart.PUBLIC, [8], 0)]
    assert all(not torch.equal(alone, o) for o in others)
    # the public batch of a step is a function of (seed, stage, step) alone
    batch = draws.public_batch(Stage.MAIN, 4, 100, 10)
    assert np.array_equal(batch, PublicDraws(5).public_batch(Stage.MAIN, 4, 100, 10))
    assert not np.array_equal(batch, draws.public_batch(Stage.MAIN, 5, 100, 10))
    assert not np.array_equal(batch, draws.public_batch(Stage.PRETRAIN, 4, 100, 10))


@pytest.mark.parametrize(("kwargs", "match"), [({"seed": -1}, r"seed=-1"), ({"seed": 1.5}, r"seed=1\.5")])
def test_public_draws_refuse_a_bad_seed(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        PublicDraws(**kwargs)


def test_unknown_part_is_refused_by_name() -> None:
    task = DiffusionTask(_loss())
    x = torch.zeros((2, *SHAPE.as_tuple()))
    with pytest.raises(ValueError, match=r"part='blurred'"):
        # a part that is no LossPart, on purpose: refused at run time
        task.parts("blurred", x, torch.zeros(2, dtype=torch.long), [torch.Generator()] * 2)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# (a) exact: the public part is the same whatever the private batch holds
# --------------------------------------------------------------------------------------


def _noisy_view(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """A Ψ that draws random values: the blur plus public Gaussian jitter."""
    if generator is None:
        raise TypeError("needs a generator")
    return GaussianBlur(3, 1.0)(x) + 0.05 * torch.randn(x.shape, generator=generator, dtype=x.dtype)


@pytest.mark.parametrize("task_kind", ["diffusion", "classification-random-psi"])
def test_public_part_is_bit_identical_for_two_private_batch_sizes(task_kind: str) -> None:
    """Same seed, private batches of 1 and of 25 records at every step: the public
    batch, its records' draws and the packed public inputs of every step (one
    pre-training step, three main steps) are bit-identical."""
    data = _images()
    inner: DiffusionTask | ClassificationTask
    if task_kind == "diffusion":
        inner, model = DiffusionTask(_loss()), _denoiser
    else:
        psi = check_public_map(_noisy_view, torch.tensor(data.x[:4]), name="jitter")
        assert psi.needs_generator
        inner, model = ClassificationTask(psi), _classifier
    runs = {}
    for size in (1, 25):
        runs[size] = Recording(inner)
        train(model(), runs[size], data, _settings(), secrets=ForcedCoins(size, 100))
        assert sum(len(x) for x, _, _ in runs[size].of(LossPart.PRIVATE)) == 3 * size  # chunks of 16
    small, large = runs[1].of(LossPart.PUBLIC), runs[25].of(LossPart.PUBLIC)
    assert len(small) == len(large) == 4
    for (xa, ia, ta), (xb, ib, tb) in zip(small, large, strict=True):
        assert torch.equal(xa, xb)  # the same public records
        assert torch.equal(ta, tb)  # the same noise ε (diffusion) / labels
        assert all(torch.equal(a, b) for a, b in zip(ia, ib, strict=True))  # the same views and x̃_t, t, y


def test_public_part_of_a_multi_step_run_ignores_the_coins() -> None:
    """Three private steps with random coins from two different secret seeds: the
    realised batch sizes differ, every public input of every step is identical."""
    data = _images()
    tasks = []
    sizes = []
    for secret in (1, 2):
        task = Recording(DiffusionTask(_loss()))
        train(_denoiser(), task, data, _settings(steps=3), secrets=SeededBits(np.random.SeedSequence(secret)))
        tasks.append(task)
        sizes.append([len(x) for x, _, _ in task.of(LossPart.PRIVATE)])
    assert sizes[0] != sizes[1]
    a, b = (t.of(LossPart.PUBLIC) for t in tasks)
    assert len(a) == len(b) == 4  # one pre-training step and three main steps
    for (xa, ia, ta), (xb, ib, tb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ta, tb)
        assert all(torch.equal(u, v) for u, v in zip(ia, ib, strict=True))


# --------------------------------------------------------------------------------------
# (b) the replay attack: |B_t| from the public gradient
# --------------------------------------------------------------------------------------


def _public_gradient(model: nn.Module, loss: DiffusionLoss, inputs: list[torch.Tensor],
                     targets: torch.Tensor) -> torch.Tensor:
    """``Σ ∇ℓ_pub`` at ``model``'s weights, flattened (what the update releases unnoised)."""
    total = loss.public_loss([model(v) for v in inputs], targets).sum()
    return torch.cat([g.ravel() for g in torch.autograd.grad(total, list(model.parameters()))])


def old_order_public_gradient(model: nn.Module, loss: DiffusionLoss, data: ImageSet, seed: int,
                              private_size: int) -> torch.Tensor:
    """The public gradient of the first private step under the OLD draw order (a local
    reproduction; production no longer draws this way): one public generator, seeded
    from the run seed, gives the private batch's ``(t, ε)`` first (chunk by chunk),
    then the public batch's. Only ``|B_t|`` matters, not which records it holds."""
    seq = np.random.SeedSequence(entropy=seed, spawn_key=(7,))
    batch_rng = np.random.default_rng(seq.spawn(1)[0])
    seq.spawn(1)  # the old nonprivate coins' stream
    gen = torch.Generator().manual_seed(int(seq.generate_state(1, np.uint64)[0] >> np.uint64(1)))
    for s in range(0, private_size, CHUNK):
        draw_noise(min(CHUNK, private_size - s), SHAPE, loss.schedule, gen)
    x, y = data.tensors()
    pub = torch.as_tensor(uniform_sample(len(data), M_PUB, batch_rng))
    grads = []
    for s in range(0, M_PUB, CHUNK):
        idx = pub[s : s + CHUNK]
        draw = draw_noise(len(idx), SHAPE, loss.schedule, gen)
        grads.append(_public_gradient(model, loss, loss.public_inputs(x[idx], y[idx], draw, gen), draw.noise))
    return torch.stack(grads).sum(0)


def new_public_gradient(model_state: dict, loss: DiffusionLoss, data: ImageSet, seed: int,
                        secrets) -> tuple[torch.Tensor, int]:
    """The public gradient (at the initial weights) and ``|B_t|`` of the first private
    step of the real trainer with secret stream ``secrets``."""
    task = Recording(DiffusionTask(loss))
    model = _denoiser()
    model.load_state_dict(model_state)
    train(model, task, data, _settings(steps=1, pretrain_steps=0, seed=seed), secrets=secrets)
    start = _denoiser()
    start.load_state_dict(model_state)
    public = task.of(LossPart.PUBLIC)
    grads = [_public_gradient(start, loss, inputs, targets) for _, inputs, targets in public]
    return torch.stack(grads).sum(0), sum(len(x) for x, _, _ in task.of(LossPart.PRIVATE))


def _guess(residuals: np.ndarray, prior: np.ndarray) -> int:
    """The adversary's guess: among the candidates that reproduce the released gradient
    best, the one the prior (Binomial(N, q)) finds likeliest."""
    best = np.flatnonzero(residuals == residuals.min())
    return int(best[np.argmax(prior[best])])


def replay_attack(trials: int) -> dict[str, Any]:
    """Both attacks on the same seed, data and trials; residuals are relative L2."""
    data, loss = _images(), _loss()
    start = _denoiser().state_dict()
    prior = stats.binom.pmf(np.arange(N + 1), N, Q)
    model = _denoiser()
    model.load_state_dict(start)
    old_table = [old_order_public_gradient(model, loss, data, SEED, b) for b in range(N + 1)]
    new_table = [new_public_gradient(start, loss, data, SEED, ForcedCoins(b, 0))[0] for b in range(N + 1)]
    out: dict[str, list] = {"true": [], "old_guess": [], "new_guess": [], "old_at_true": [],
                            "old_best_wrong": [], "new_spread": []}
    for trial in range(trials):
        secrets = SeededBits(np.random.SeedSequence([SEED, trial]))
        released, size = new_public_gradient(start, loss, data, SEED, secrets)
        old_released = old_order_public_gradient(model, loss, data, SEED, size)  # the old trainer, same coins
        old_res = np.array([float((old_released - g).norm() / old_released.norm()) for g in old_table])
        new_res = np.array([float((released - g).norm() / released.norm()) for g in new_table])
        out["true"].append(size)
        out["old_guess"].append(_guess(old_res, prior))
        out["new_guess"].append(_guess(new_res, prior))
        out["old_at_true"].append(old_res[size])
        out["old_best_wrong"].append(float(np.delete(old_res, size).min()))
        out["new_spread"].append(float(new_res.max() - new_res.min()))
    return {**{k: np.array(v) for k, v in out.items()}, "chance": float(prior.max())}


def test_replay_attack_recovers_the_batch_size_from_the_old_order_only() -> None:
    trials = 24
    r = replay_attack(trials)
    true = r["true"]
    assert len(set(true.tolist())) > 3  # the coins did vary
    # before: the replay reproduces the released public gradient exactly at |B_t| only
    assert np.all(r["old_at_true"] == 0.0)
    assert np.all(r["old_best_wrong"] > 1e-3)
    assert np.array_equal(r["old_guess"], true)  # |B_t| recovered in every trial
    # after: every candidate size reproduces it exactly, so the gradient says nothing
    assert np.all(r["new_spread"] == 0.0)
    wins = int(np.sum(r["new_guess"] == true))
    # guessing the prior's mode succeeds with probability `chance`; 99.9% tolerance
    assert wins <= stats.binom.ppf(0.999, trials, r["chance"])
