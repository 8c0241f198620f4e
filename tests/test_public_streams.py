"""The engine's public randomness for images does not depend on the private batch.

A round releases the public sum (unclipped ``∇ℓ_pub`` over a uniform public batch)
without noise. If the public part's draws — the public batch, the diffusion draws
``(t, ε)`` of its records, a random Ψ's draws — came from a generator the private
batch had consumed first, the public sum would depend on ``|B_t|``: an adversary
who knows the seed replays the generator for every candidate size and reads
``|B_t|`` off the released gradient (an earlier image trainer drew this way). In the
engine every public draw is keyed by public quantities only: the public batch by
(seed, round, device) (:mod:`fedfdp.sampling`), each record's draws by (seed, round,
part, device, index) (:class:`fedfdp.losses.RecordKeys`).

The tests go through a node's contribution (:func:`fedfdp.contribution.node_contribution`),
the private batch chosen through the sampler seam a normal run uses:

* exact: the released public sum of a round is bit-identical for private batches
  of 1 and 25 records (diffusion; and classification with a Ψ that draws random
  values), and over three rounds with coins from two different secret seeds;
* the replay attack, re-implemented: against a local reproduction of the old
  draw order (here, not in production) it recovers ``|B_t|`` in every trial
  (replay residual exactly 0 at the true size, > 0 elsewhere); against the engine
  every candidate size reproduces the released public sum exactly (residual spread
  0), so the adversary can do no better than guess from the prior: its success
  count stays within the 99.9% quantile of the binomial of guessing the prior's mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from fedfdp.config import Mode
from fedfdp.contribution import ClientParts, DeviceTask, RoundSettings, independent_batches, node_contribution
from fedfdp.entropy import SeededEntropy
from fedfdp.images.blur import GaussianBlur, check_public_map
from fedfdp.images.data import ImageSet, ImageShape
from fedfdp.images.diffusion import DiffusionFeatureMap, DiffusionLoss, NoiseSchedule, draw_noise
from fedfdp.losses import FeatureMap
from fedfdp.modes import PHASES
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


def _feature_map(kind: str, data: ImageSet) -> tuple[FeatureMap, Callable[[], nn.Module]]:
    """The engine's feature map of ``kind`` and a model for it."""
    if kind == "diffusion":
        loss = _loss()
        return DiffusionFeatureMap(view=loss.psi, loss=loss), _denoiser
    psi = check_public_map(_noisy_view, torch.tensor(data.x[:4]), name="jitter")
    assert psi.needs_generator
    return FeatureMap(view=psi), _classifier


Sampler = Callable[..., tuple[np.ndarray, np.ndarray]]


def forced(size: int) -> Sampler:
    """The honest sampler's public batch (same stream), the private batch forced to the
    first ``size`` records."""
    def sampler(n, rate, public_count, secrets, public):
        _, pub = independent_batches(n, rate, public_count, secrets, public)
        return np.arange(size, dtype=np.int64), pub
    return sampler


def recording(sizes: list[int], inner: Sampler = independent_batches) -> Sampler:
    """``inner`` (by default the honest sampler), recording each private batch's size."""
    def sampler(n, rate, public_count, secrets, public):
        private, pub = inner(n, rate, public_count, secrets, public)
        sizes.append(len(private))
        return private, pub
    return sampler


def round_sums(model: nn.Module, fmap: FeatureMap, data: ImageSet, round_: int, sampler: Sampler,
               secret: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A node's (public sum, private sum) of round ``round_`` (phase fdp), flattened."""
    settings = RoundSettings(round=round_, attempt=0, phase=PHASES[Mode.FDP], sampling_rate=Q,
                             clipping_norm=1.0, public_seed=SEED)
    task = DeviceTask(0, np.array(data.x), np.array(data.y), True, M_PUB)
    out = node_contribution(model, fmap, settings, [task],
                            ClientParts(secrets=SeededEntropy(secret), batches=sampler))
    assert out.public_sum is not None and out.private_sum is not None and out.public_count == M_PUB
    return (torch.cat([g.ravel() for g in out.public_sum]), torch.cat([g.ravel() for g in out.private_sum]))


# --------------------------------------------------------------------------------------
# (a) the released public sum ignores the private batch
# --------------------------------------------------------------------------------------


def _noisy_view(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """A Ψ that draws random values: the blur plus public Gaussian jitter."""
    if generator is None:
        raise TypeError("needs a generator")
    return GaussianBlur(3, 1.0)(x) + 0.05 * torch.randn(x.shape, generator=generator, dtype=x.dtype)


@pytest.mark.parametrize("task_kind", ["diffusion", "classification-random-psi"])
def test_public_part_is_bit_identical_for_two_private_batch_sizes(task_kind: str) -> None:
    """Same seed, private batches of 1 and of 25 records in each of three rounds: the
    released public sum of every round is bit-identical (the private sums differ)."""
    data = _images()
    fmap, make = _feature_map(task_kind, data)
    model = make()
    for round_ in (1, 2, 3):
        pub_small, priv_small = round_sums(model, fmap, data, round_, forced(1))
        pub_large, priv_large = round_sums(model, fmap, data, round_, forced(25))
        assert torch.equal(pub_small, pub_large)
        assert not torch.equal(priv_small, priv_large)  # the forced batches did reach the private sum


def test_public_part_of_a_multi_round_run_ignores_the_coins() -> None:
    """Three rounds with random coins from two different secret seeds: the realised batch
    sizes differ, every round's public sum is identical."""
    data = _images()
    fmap, make = _feature_map("diffusion", data)
    model = make()
    sizes: list[list[int]] = [[], []]
    sums: list[list[torch.Tensor]] = [[], []]
    for k, secret in enumerate((1, 2)):
        for round_ in (1, 2, 3):
            sums[k].append(round_sums(model, fmap, data, round_, recording(sizes[k]), secret)[0])
    assert sizes[0] != sizes[1]
    assert all(torch.equal(a, b) for a, b in zip(*sums, strict=True))


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


def new_public_gradient(model_state: dict, loss: DiffusionLoss, data: ImageSet, sampler: Sampler,
                        secret: int = 0) -> tuple[torch.Tensor, int]:
    """The engine's released public sum of a round (at the initial weights) and ``|B_t|``."""
    model = _denoiser()
    model.load_state_dict(model_state)
    sizes: list[int] = []
    fmap = DiffusionFeatureMap(view=loss.psi, loss=loss)
    public, _ = round_sums(model, fmap, data, 1, recording(sizes, sampler), secret)
    return public, sizes[0]


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
    new_table = [new_public_gradient(start, loss, data, forced(b))[0] for b in range(N + 1)]
    out: dict[str, list] = {"true": [], "old_guess": [], "new_guess": [], "old_at_true": [],
                            "old_best_wrong": [], "new_spread": []}
    for trial in range(trials):
        released, size = new_public_gradient(start, loss, data, independent_batches, 1000 * SEED + trial)
        old_released = old_order_public_gradient(model, loss, data, SEED, size)  # the old order, same size
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
