"""Server-side evaluation on held-out records (never on private training data:
metrics computed on training records are outside the guarantee).

:func:`held_out_metrics` reports the four numbers every run records:

``accuracy``
    share of correct predictions;
``balanced_accuracy``
    mean over the classes present of each class's recall (a majority-class
    predictor scores ``1/K``, whatever the class balance);
``auc``
    area under the ROC curve of the positive class (binary tasks only, NaN
    otherwise), from the ranks of the predicted probabilities (Mann–Whitney,
    ties counted one half);
``loss``
    log loss: the mean cross-entropy of the predicted probabilities.

Before a run, :func:`check_run_inputs` checks once that the model, the data and the
feature map fit together (a run that would only fail, or train a model that cannot
be right, is refused in one line naming what does not fit).

:func:`held_out_evaluation` makes the ``evaluate(round, model)`` a run loop calls
(:data:`EvaluateFn`).

Both run the model on its device (:func:`fedfdp.contribution.model_device`) and read
its outputs back to the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedfdp.config import ConfigError
from fedfdp.contribution import CPU, model_device

if TYPE_CHECKING:
    from fedfdp.data import FederatedData
    from fedfdp.losses import FeatureMap, LossTerms

#: The metrics of :func:`held_out_metrics`, in column order.
METRICS = ("accuracy", "balanced_accuracy", "auc", "loss")

#: ``evaluate_fn(round, model) -> metrics``: server-side evaluation on held-out
#: data (``accuracy`` and ``loss`` fill those columns of ``metrics.csv``; other
#: keys become columns too). Never on private training data.
EvaluateFn = Callable[[int, nn.Module], Mapping[str, float] | None]


def binary_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC of ``scores`` for ``labels ∈ {0, 1}`` (NaN without both classes)."""
    labels = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = np.asarray(scores)[order]
    # average ranks over ties
    _, start, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = start + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


@torch.no_grad()
def held_out_metrics(model: nn.Module, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Accuracy, balanced accuracy, AUC (binary) and log loss on held-out records."""
    if len(y) == 0:
        return dict.fromkeys(METRICS, float("nan"))
    logits = model(torch.as_tensor(x).to(model_device(model))).to(CPU)
    target = torch.as_tensor(y, dtype=torch.long)
    loss = F.cross_entropy(logits, target).item()
    pred = logits.argmax(1).numpy()
    truth = np.asarray(y)
    recalls = [float(np.mean(pred[truth == c] == c)) for c in np.unique(truth)]
    auc = float("nan")
    if logits.shape[1] == 2:
        auc = binary_auc(torch.softmax(logits.double(), 1)[:, 1].numpy(), truth == 1)
    return {
        "accuracy": float(np.mean(pred == truth)),
        "balanced_accuracy": float(np.mean(recalls)),
        "auc": auc,
        "loss": loss if math.isfinite(loss) else float("inf"),
    }


def held_out_evaluation(x: np.ndarray, y: np.ndarray) -> EvaluateFn:
    """An ``evaluate_fn`` reporting accuracy, balanced accuracy, AUC (binary) and
    log loss on ``(x, y)`` (:func:`held_out_metrics`).
    """

    def evaluate_fn(round_: int, model: nn.Module) -> dict[str, float]:
        return held_out_metrics(model, x, y)

    return evaluate_fn


def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Accuracy and mean cross-entropy on held-out records."""
    m = held_out_metrics(model, x, y)
    return m["accuracy"], m["loss"]


def probe_terms(feature_map: FeatureMap, x: torch.Tensor, y: torch.Tensor) -> LossTerms:
    """The terms of ``ℓ`` on a few records ``(x, y)`` as training computes them (keys of
    round 0 on device 0: public draws): what a check before a run feeds the model.
    """
    from fedfdp.losses import LossPart, RecordKeys

    keys = RecordKeys.of(0, 0, 0, range(len(x)))
    return feature_map.terms(LossPart.FULL, x, y, torch.Generator().manual_seed(0), keys)


def _first_bad(values: np.ndarray) -> tuple[int, ...]:
    """Index of the first non-finite entry of ``values``."""
    return tuple(int(i) for i in np.argwhere(~np.isfinite(values))[0])


@torch.no_grad()
def check_run_inputs(model: nn.Module, data: FederatedData, feature_map: FeatureMap | None = None) -> None:
    """Refuse, once before a run, a model, data and feature map that do not fit together.

    Checked: every input of every device and of the held-out split is finite; every
    label is a class index in ``[0, K)`` with ``K = data.num_classes``; the model
    accepts a device's records and returns ``K`` outputs per record (so a model of
    the wrong input width, or with more or fewer outputs than classes, is refused);
    the feature map's view keeps the batch's shape and dtype and returns finite
    values. A model that is not a classifier of the records (``feature_map.classifier``
    false: a diffusion model on packed inputs) is run on the inputs of ``ℓ``
    (:func:`probe_terms`) and must return one target's shape per record and a finite
    loss. Nothing is trained and the model's state is unchanged (it runs in
    ``eval`` mode without gradients).

    Raises
    ------
    ConfigError
        One line naming the device, record, label or shape that does not fit.
    """
    classes = data.num_classes
    if len(data.test_y) == 0 and data.num_records:
        raise ConfigError("data: the held-out split is empty (0 records), so the run's evaluation has "
                          "nothing to score; hold out records (test-fraction, or test-path)")
    parts = [(f"device {i}", dev.x, dev.y) for i, dev in enumerate(data.devices)]
    parts.append(("the held-out split", data.test_x, data.test_y))
    for where, x, y in parts:
        x_arr, y_arr = np.asarray(x), np.asarray(y)
        if x_arr.size and np.issubdtype(x_arr.dtype, np.floating) and not np.isfinite(x_arr).all():
            index = _first_bad(x_arr)
            raise ConfigError(f"data: {where} has a non-finite input (NaN or inf) at record {index[0]}, "
                              f"position {index[1:]}; clean or impute it before the run")
        if y_arr.size and (y_arr.min() < 0 or y_arr.max() >= classes):
            bad = y_arr[(y_arr < 0) | (y_arr >= classes)][0]
            raise ConfigError(f"data: {where} has label {bad.item()!r}, outside the {classes} classes "
                              f"(labels are class indices 0..{classes - 1})")
    sample = next((np.asarray(dev.x[:2]) for dev in data.devices if len(dev.y)), None)
    if sample is None:
        return
    batch = torch.as_tensor(sample)
    device = model_device(model)
    bad = next((name for name, t in model.state_dict().items()
                if t.is_floating_point() and not bool(torch.isfinite(t).all())), None)
    if bad is not None:
        raise ConfigError(f"model: its initial parameter {bad!r} is not finite (NaN or inf); the model "
                          "builder must return finite weights")
    if feature_map is not None and not feature_map.classifier:
        _check_terms(model, data, feature_map, batch)
        return
    was_training = model.training
    model.eval()
    try:
        out = model(batch.to(device))
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ConfigError(f"model: does not accept the data's records (shape {tuple(batch.shape[1:])} each): "
                          f"{type(exc).__name__}: {first}") from exc
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[1] != classes:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        n = len(batch)
        raise ConfigError(f"model: returns {got} for {n} records, but the data has {classes} classes "
                          f"(one output per class: shape ({n}, {classes}))")
    if not bool(torch.isfinite(out).all()):
        raise ConfigError("model: returns non-finite outputs (NaN or inf) for the data's first records; "
                          "training on them could only diverge")
    if feature_map is None or feature_map.view is None:
        return
    try:
        feature_map.check(batch)
        view = feature_map.view(batch, torch.Generator().manual_seed(0))
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from exc
    except (RuntimeError, TypeError, IndexError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ConfigError(f"feature map view: raised {type(exc).__name__}: {first} (a view is "
                          "view(x, generator) -> a tensor of x's shape)") from exc
    if not bool(torch.isfinite(view).all()):
        raise ConfigError("feature map view: returned a non-finite value (NaN or inf) for finite records")


@torch.no_grad()
def _check_terms(model: nn.Module, data: FederatedData, feature_map: FeatureMap, batch: torch.Tensor) -> None:
    """:func:`check_run_inputs` for a model that is not a classifier of the records."""
    first_labels = next(dev.y[:2] for dev in data.devices if len(dev.y))
    labels = torch.as_tensor(np.asarray(first_labels), dtype=torch.long)
    try:
        feature_map.check(batch)
        terms = probe_terms(feature_map, batch, labels)
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from exc
    was_training = model.training
    model.eval()
    device = model_device(model)
    try:
        outputs = [model(inp.to(device)) for inp in terms.inputs]
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        shape = tuple(terms.inputs[0].shape[1:])
        raise ConfigError(f"model: does not accept the loss's inputs (shape {shape} each): "
                          f"{type(exc).__name__}: {first}") from exc
    finally:
        model.train(was_training)
    out, target = outputs[0], terms.targets
    if not isinstance(out, torch.Tensor) or out.shape != target.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"model: returns {got} for {len(batch)} records; the loss's targets have shape "
                          f"{tuple(target.shape)}")
    if not bool(torch.isfinite(terms.loss(outputs, target.to(device))).all()):
        raise ConfigError("model: a non-finite loss (NaN or inf) on finite records")
