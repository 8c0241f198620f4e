"""Where a run computes: on the device of the model's parameters, every draw on the CPU.

* A model split over devices, or on the meta device (shapes without values), is refused
  in one line naming the devices — by the round engine, a node's contribution (before
  anything is drawn) and a whole run (nothing charged). Runs here, on the CPU and meta
  devices.
* On a GPU (skipped without one): a run whose model is on ``cuda`` releases the same
  ledger and ε as the same run on the CPU (every draw is made on the CPU from the same
  streams), ends at parameters within a float tolerance of the CPU run's, and writes
  ``model.pt`` and ``checkpoint.pt`` with CPU tensors; a run stopped on one device
  resumes on the other.
"""

import copy
import shutil

import numpy as np
import pytest
import torch
from torch import nn

from fedfdp.algorithm import run_centralised
from fedfdp.checkpoint import CHECKPOINT_FILE, on_cpu
from fedfdp.config import ConfigError, Mode, load_config
from fedfdp.contribution import ClientParts, DeviceTask, RoundSettings, model_device, node_contribution
from fedfdp.data import load_dataset
from fedfdp.entropy import SystemEntropy
from fedfdp.ledger import LEDGER_FILE
from fedfdp.losses import FeatureMap
from fedfdp.models import build_model_for
from fedfdp.modes import PHASES
from fedfdp.run_files import MODEL_FILE
from fedfdp.run_plan import build_plan
from tests.mechanism_helpers import ledger_doc

SMALL = {"num-devices": 3, "records-per-device": 30, "num-rounds": 2, "seed": 4, "progress": False,
         "reproducible-noise": True}


def _split(model: nn.Module) -> nn.Module:
    """``model`` with one more parameter, on the meta device: a model on two devices."""
    model.register_parameter("elsewhere", nn.Parameter(torch.zeros(3, device="meta")))
    return model


def test_the_device_is_the_parameters_and_the_cpu_without_any():
    assert model_device(nn.Linear(4, 2)) == torch.device("cpu")
    assert model_device(nn.ReLU()) == torch.device("cpu")


@pytest.mark.parametrize(("model", "named"), [
    (lambda: _split(nn.Linear(4, 2)), "(cpu, meta)"),
    (lambda: nn.Linear(4, 2, device="meta"), "meta device"),
], ids=["split", "meta"])
def test_a_model_on_two_devices_or_on_meta_is_refused_in_one_line(model, named):
    with pytest.raises(ConfigError) as err:
        model_device(model())
    assert named in str(err.value) and "\n" not in str(err.value)


def test_the_round_engine_refuses_a_split_model():
    cfg = load_config(SMALL)
    model = _split(nn.Linear(4, 2))
    plan = build_plan(cfg, model=model, num_devices=3)
    with pytest.raises(ConfigError, match=r"more than one device \(cpu, meta\)"):
        plan.engine([30, 30, 30])


def test_a_node_refuses_a_split_model_before_drawing_anything():
    drawn: list[int] = []

    def sampler(n, rate, public_count, secrets, public):
        drawn.append(n)
        return np.arange(n), np.arange(public_count)

    rng = np.random.default_rng(0)
    task = DeviceTask(0, rng.normal(size=(20, 4)).astype(np.float32), rng.integers(0, 2, 20), True, 4)
    settings = RoundSettings(round=1, attempt=0, phase=PHASES[Mode.FDP], sampling_rate=0.5, clipping_norm=1.0)
    fmap = FeatureMap.columns(["a", "b", "c", "d"], private=["d"], view="zero")
    parts = ClientParts(secrets=SystemEntropy(), batches=sampler)
    assert node_contribution(nn.Linear(4, 2), fmap, settings, [task], parts).public_count == 4
    assert drawn == [20]
    with pytest.raises(ConfigError, match=r"\(cpu, meta\)"):
        node_contribution(_split(nn.Linear(4, 2)), fmap, settings, [task], parts)
    assert drawn == [20]


def test_a_run_with_a_split_model_is_refused_and_charges_nothing(tmp_path):
    cfg = load_config({**SMALL, "out-dir": str(tmp_path / "run")})
    data = load_dataset(cfg.data)
    model = _split(build_model_for(cfg.training, data))
    with pytest.raises(ConfigError, match=r"\(cpu, meta\)"):
        run_centralised(cfg, data, model=model)
    assert not (tmp_path / "run" / LEDGER_FILE).exists()


def test_a_cpu_state_is_written_as_it_is():
    """``on_cpu`` of an all-CPU state is the same object: a CPU run's files are unchanged."""
    model = nn.Sequential(nn.Linear(3, 2), nn.GroupNorm(1, 2))
    state = model.state_dict()
    assert on_cpu(state) is state
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    opt_state = optimizer.state_dict()
    assert on_cpu(opt_state) is opt_state


# ---------------------------------------------------------------------------------------
# on a GPU
# ---------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
GPU = torch.device("cuda", 0)

#: Largest |difference| allowed between a parameter trained on the GPU and on the CPU, TF32
#: off: float32 gradients that differ in their last bits (other kernels, other orders of
#: additions) under the same noise, over 3 steps.
PARAM_TOLERANCE = 1e-4

CNN = {"dataset": "digits", "model": "cnn", "cnn-width": 4, "hidden-size": 8, "num-devices": 5,
       "num-rounds": 3, "noise-multiplier": 1.0, "clipping-quantile": 0.0, "sampling-rate": 0.2,
       "public-batch-size": 24, "seed": 3, "reproducible-noise": True, "progress": False}
DDPM = {"dataset": "digits", "model": "ddpm", "unet-width": 4, "diffusion-steps": 25, "eval-samples": 20,
        "sampler-steps": 4, "num-devices": 4, "blur-kernel": 5, "blur-sigma": 1.0, "num-rounds": 3,
        "noise-multiplier": 1.0, "clipping-quantile": 0.0, "seed": 3, "reproducible-noise": True,
        "progress": False}
CORRDP = {"mode": "corrdp", "dataset": "correlated", "num-sensitive": 1, "num-insensitive": 3,
          "correlation": 0.5, "corrdp-weight-bound": 0.8, "noise-multiplier": 1.5, "clipping-norm": 0.5,
          "insensitive-tv": "*=0.5", "learning-rate": 2.0, "num-devices": 4, "num-rounds": 3, "seed": 3,
          "reproducible-noise": True, "progress": False}


@pytest.fixture
def _exact_float32():
    """TF32 off for the comparison (it rounds float32 products to 10 bits)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _cpu_tensors(path) -> dict:
    """``path`` loaded without a map_location: the tensors as they were saved."""
    doc = torch.load(path, weights_only=True)
    tensors = []

    def walk(v):
        if isinstance(v, torch.Tensor):
            tensors.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(doc)
    assert tensors and all(t.device.type == "cpu" for t in tensors), path
    return doc


def _close(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert p.device.type == "cpu" and q.device == GPU
        diff = float((p.detach() - q.detach().cpu()).abs().max())
        assert diff <= PARAM_TOLERANCE, f"{name}: |cpu - cuda| = {diff:.3g}"


@needs_cuda
@pytest.mark.usefixtures("_exact_float32")
@pytest.mark.parametrize("keys", [CNN, DDPM, CORRDP], ids=["cnn", "ddpm", "corrdp"])
def test_a_run_on_the_gpu_releases_what_the_cpu_run_does(keys, tmp_path):
    pytest.importorskip("sklearn")
    cfg = {d: load_config({**keys, "out-dir": str(tmp_path / d)}) for d in ("cpu", "gpu")}
    data = load_dataset(cfg["cpu"].data)
    initial = build_model_for(cfg["cpu"].training, data)
    on_gpu = copy.deepcopy(initial).to(GPU)
    cpu_model, cpu_rows = run_centralised(cfg["cpu"], data, model=initial)
    gpu_model, gpu_rows = run_centralised(cfg["gpu"], data, model=on_gpu)
    assert gpu_model is on_gpu and model_device(gpu_model) == GPU
    assert ledger_doc(tmp_path / "gpu") == ledger_doc(tmp_path / "cpu")
    for key in ("epsilon", "epsilon_corrdp"):  # a CorrDP run's ε is its own column (NaN in "epsilon")
        np.testing.assert_array_equal([r.get(key) for r in gpu_rows], [r.get(key) for r in cpu_rows])
    _close(cpu_model, gpu_model)
    # the files hold CPU tensors: a CPU session loads them
    written = _cpu_tensors(tmp_path / "gpu" / MODEL_FILE)
    fresh = build_model_for(cfg["cpu"].training, data)
    fresh.load_state_dict(written)
    _close(fresh, gpu_model)
    _cpu_tensors(tmp_path / "gpu" / CHECKPOINT_FILE)
    state = gpu_model.state_dict()
    moved = on_cpu(state)
    assert type(moved) is type(state) and vars(moved)["_metadata"] == vars(state)["_metadata"]


class Stop(RuntimeError):
    pass


def _stop_after(at: int):
    def evaluate(r, model):
        if r == at:
            raise Stop(f"after round {r}")
        return {}

    return evaluate


@needs_cuda
@pytest.mark.usefixtures("_exact_float32")
def test_a_run_stopped_on_one_device_resumes_on_the_other(tmp_path):
    """A run stopped inside round 2 (charged and stepped, not checkpointed) on the GPU
    resumes on the CPU and on the GPU from the same files, to the same ledger and to
    parameters within the tolerance; one stopped on the CPU resumes on the GPU."""
    pytest.importorskip("sklearn")
    data = load_dataset(load_config(CNN).data)
    model = build_model_for(load_config(CNN).training, data)

    def cfg(run, **kw):
        return load_config({**CNN, "out-dir": str(run), **kw})

    with pytest.raises(Stop):
        run_centralised(cfg(tmp_path / "a"), data, model=copy.deepcopy(model).to(GPU),
                        evaluate_fn=_stop_after(2))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    on_cpu_model, _ = run_centralised(cfg(tmp_path / "a", resume=True), data, model=copy.deepcopy(model))
    on_gpu_model, _ = run_centralised(cfg(tmp_path / "b", resume=True), data,
                                      model=copy.deepcopy(model).to(GPU))
    assert ledger_doc(tmp_path / "a") == ledger_doc(tmp_path / "b")
    _close(on_cpu_model, on_gpu_model)

    with pytest.raises(Stop):
        run_centralised(cfg(tmp_path / "c"), data, model=copy.deepcopy(model), evaluate_fn=_stop_after(2))
    resumed, rows = run_centralised(cfg(tmp_path / "c", resume=True), data,
                                    model=copy.deepcopy(model).to(GPU))
    assert model_device(resumed) == GPU and rows[-1]["round"] == 3
    _cpu_tensors(tmp_path / "c" / MODEL_FILE)
