"""The 28×28 DDPM of the README (five methods, ε = 8 and 1, seeds 0 1 2) in one timed call.

Made for one command on a lent GPU machine (one GPU, 16 cores, a fixed wall
limit, few returned files): it runs ``benchmarks/images_reference.py ddpm``
once per seed, the seeds **in parallel** (the per-step work is small kernels
and CPU-side per-record draws, so one process leaves the GPU mostly idle), each
going ε = 8 (every method) then ε = 1, and every few seconds copies what has
finished to ``--out``:

``results.csv``
    One row per finished job (method, α, target and accounted ε, σ, seed,
    steps, FD overall and per class, wall and sampling seconds, grid name),
    the three seeds' files merged, plus the reference FDs.
``summary.md``
    ``images_reference.py table`` of the merged rows: FD mean ± std over seeds
    per (method, α, ε), and FD per class per job.
``log.txt``
    This driver's log, the CUDA-vs-CPU engine test's output and every
    child's log.
``ddpm28.tar.gz``
    The work folder: every child's ``results.json``, log and sample grids.
``samples.png``
    Seed 0's sample grids tiled (``images_reference.py figure``), at the end.

Every child skips a job that its estimate says would end after ``--budget``
seconds (counted from this driver's start); at ``--hard-stop`` seconds the
children still running are stopped and the files written a last time, so the
call ends by itself before the machine's limit. Secret randomness is unchanged:
the Poisson coins and the noise come from each child's OS CSPRNG, drawn on the
CPU (the engine computes on the model's device, the draws stay on the CPU);
``--seeds`` only key the public draws.

Settings (the README's 14×14 table scaled to 28×28): Ψ = Gaussian blur kernel
9, σ = 2 px, 8-bit (the 14×14 run's kernel 5, σ = 1, doubled with the
resolution; docs/images.md's Ψ), the same U-Net (base 16, mults 1 2 2, 0.2 M
parameters), T = 1000 linear, Adam, ``nonprivate`` and ``public`` 400 steps at
learning rate 2e-3, ``dp`` 200 steps, ``fdp-dpsgd`` and ``fdp`` (α = 1 and 10)
200 private steps after the public model at 1e-3, q = 0.064, C = 0.1; FD of
500 samples (50 per class, 50 sampler steps) on a 15-epoch feature network.
Arguments this script does not know are passed to every child (they override
the settings above: ``--base 32``, ``--steps 400`` ...).

Usage (the lent machine; ``.whl`` and ``.devdata`` carried)::

    python3 benchmarks/device_ddpm28.py --device cuda --out "$OUT"
    python3 benchmarks/device_ddpm28.py --tiny --device cpu --out /tmp/ddpm28_out   # a check here
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REFERENCE = HERE / "images_reference.py"

#: The 28×28 settings (module docstring).
SETTINGS = [
    "--downsample", "1", "--kernel", "9", "--blur-sigma", "2", "--base", "16", "--mults", "1", "2", "2",
    "--steps", "200", "--nonprivate-steps", "400", "--pretrain-steps", "400", "--rate", "0.064",
    "--clip", "0.1", "--lr", "0.002", "--private-lr", "0.001", "--optimizer", "adam",
    "--public-batch", "256", "--sample-steps", "50", "--samples-per-class", "50",
    "--sample-batch", "500", "--fid-epochs", "15",
]  # fmt: skip

#: A seconds-long version of the same path (--tiny): few records per step, few samples.
TINY = [
    "--steps", "2", "--nonprivate-steps", "3", "--pretrain-steps", "3", "--rate", "0.004",
    "--public-batch", "8", "--sample-steps", "2", "--samples-per-class", "3", "--fid-epochs", "1",
]  # fmt: skip


class Driver:
    """Children, their folders, and the copies to ``out``."""

    def __init__(self, args: argparse.Namespace, passthrough: list[str]) -> None:
        self.args = args
        self.passthrough = passthrough
        self.start = time.monotonic()
        self.work: Path = args.work
        self.out: Path = args.out
        self.children: dict[str, subprocess.Popen] = {}
        self.log_lines: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def log(self, line: str) -> None:
        text = f"[{time.strftime('%H:%M:%S')} +{self.elapsed():.0f}s] {line}"
        print(text, flush=True)
        self.log_lines.append(text)

    def seed_dir(self, seed: int) -> Path:
        return self.work / f"seed{seed}"

    def child_command(self, seed: int) -> list[str]:
        a = self.args
        threads = max(1, ((os.cpu_count() or 2) - 1) // len(a.seeds))
        feature_net = a.feature_net if not a.tiny else self.work / "fdnet_tiny.npz"
        command = [
            sys.executable, str(REFERENCE), "ddpm", *SETTINGS, *(TINY if a.tiny else []),
            "--seeds", str(seed), "--epsilon", *map(str, a.epsilon), "--alpha", *map(str, a.alpha),
            "--device", a.device, "--threads", str(threads), "--data", str(a.data),
            "--feature-net", str(feature_net),
            "--time-budget", f"{max(1.0, a.budget - self.elapsed()):.0f}",
            "--out", str(self.seed_dir(seed)),
            *self.passthrough,
        ]  # fmt: skip
        return command

    def launch(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.args.device == "cuda":
            test = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "tests/test_compute_device.py"]  # fmt: skip
            self.log("CUDA-vs-CPU engine test: " + " ".join(test))
            with open(self.work / "cuda_test.txt", "w") as f:
                self.children["cuda-test"] = subprocess.Popen(
                    test, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT
                )
        for seed in self.args.seeds:
            command = self.child_command(seed)
            self.seed_dir(seed).mkdir(parents=True, exist_ok=True)
            self.log(f"seed {seed}: " + " ".join(command))
            with open(self.seed_dir(seed) / "stdout.txt", "w") as f:
                self.children[f"seed{seed}"] = subprocess.Popen(
                    command, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT
                )

    def running(self) -> list[str]:
        return [name for name, p in self.children.items() if p.poll() is None]

    def stop(self) -> None:
        for name in self.running():
            self.log(f"hard stop: terminating {name}")
            self.children[name].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for name, p in self.children.items():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.log(f"hard stop: killing {name}")
                p.kill()
                p.wait()

    def merged_rows(self) -> tuple[dict | None, list[dict]]:
        config, rows, refs = None, [], []
        for seed in self.args.seeds:
            path = self.seed_dir(seed) / "results.json"
            if not path.exists():
                continue
            saved = json.loads(path.read_text())
            config = config or saved["config"]
            for r in saved["rows"]:
                if "method" in r:
                    rows.append(r)
                elif seed == self.args.seeds[0]:
                    refs.append(r)  # the same split and feature network for every seed
        return config, refs + rows

    def replace(self, name: str, write) -> None:
        target = self.out / name
        tmp = target.with_name(name + ".tmp")
        write(tmp)
        os.replace(tmp, target)

    def export(self, final: bool = False) -> None:
        config, rows = self.merged_rows()
        if config is not None:
            merged = self.work / "merged"
            merged.mkdir(exist_ok=True)
            (merged / "results.json").write_text(json.dumps({"config": config, "rows": rows}, indent=1))
            table = subprocess.run(
                [sys.executable, str(REFERENCE), "table", "--out", str(merged)],
                cwd=ROOT, capture_output=True, text=True, check=False,
            )  # fmt: skip
            self.replace("summary.md", lambda p: p.write_text(table.stdout + table.stderr))
            if (merged / "results.csv").exists():  # written by the table task
                self.replace("results.csv", lambda p: shutil.copyfile(merged / "results.csv", p))
        parts = ["\n".join(self.log_lines)]
        test = self.work / "cuda_test.txt"
        if test.exists():
            parts.append("=== CUDA-vs-CPU engine test ===\n" + test.read_text())
        for seed in self.args.seeds:
            for name in ("log.txt", "stdout.txt"):
                path = self.seed_dir(seed) / name
                if path.exists():
                    parts.append(f"=== seed {seed} {name} ===\n" + path.read_text())
        self.replace("log.txt", lambda p: p.write_text("\n".join(parts) + "\n"))

        def tar(path: Path) -> None:
            with tarfile.open(path, "w:gz") as archive:
                archive.add(self.work, arcname="ddpm28")

        self.replace("ddpm28.tar.gz", tar)
        if final:
            first = self.seed_dir(self.args.seeds[0])
            if (first / "results.json").exists():
                result = subprocess.run(
                    [sys.executable, str(REFERENCE), "figure", "--out", str(first),
                     "--figure", str(self.work / "samples.png")],
                    cwd=ROOT, capture_output=True, text=True, check=False,
                )  # fmt: skip
                if result.returncode == 0:
                    self.replace("samples.png", lambda p: shutil.copyfile(self.work / "samples.png", p))
                else:
                    self.log(f"figure failed: {result.stderr.strip()[-500:]}")

    def run(self) -> int:
        self.log(f"driver start: budget {self.args.budget:.0f} s, hard stop {self.args.hard_stop:.0f} s")
        self.launch()
        last = 0.0
        while self.running():
            if self.elapsed() >= self.args.hard_stop:
                self.stop()
                break
            time.sleep(1.0)
            if self.elapsed() - last >= self.args.every:
                last = self.elapsed()
                self.export()
        for name, p in self.children.items():
            self.log(f"{name} exit status {p.returncode}")
        self.export(final=True)
        self.log("driver done")
        self.export(final=False)  # the log with its last lines
        failed = [n for n, p in self.children.items() if p.returncode not in (0, -signal.SIGTERM)]
        return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="where the few returned files go")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ddpm28"), help="the children's folders")
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epsilon", type=float, nargs="+", default=[8.0, 1.0])
    parser.add_argument("--alpha", type=float, nargs="+", default=[1.0],
                        help="weights of the private part (the default recipe needs none but 1)")
    parser.add_argument("--data", type=Path, default=ROOT / ".devdata" / "mnist5k.npz")
    parser.add_argument("--feature-net", type=Path, default=ROOT / ".devdata" / "fdnet28_e15.npz")
    parser.add_argument("--budget", type=float, default=450.0, help="no job is started that would end later")
    parser.add_argument("--hard-stop", type=float, default=490.0, help="children still running are stopped")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between copies to --out")
    parser.add_argument("--tiny", action="store_true", help="a seconds-long check of the same path")
    args, passthrough = parser.parse_known_args()
    for name in ("budget", "hard_stop", "every"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be > 0")
    if not args.data.exists():
        parser.error(f"--data {args.data}: no such file")
    marker = args.work / ".device_ddpm28"
    if args.work.exists():
        if not marker.exists():
            parser.error(f"--work {args.work}: exists and is not this script's work folder")
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True)
    marker.touch()
    sys.exit(Driver(args, passthrough).run())


if __name__ == "__main__":
    main()
