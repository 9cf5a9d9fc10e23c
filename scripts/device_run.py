"""One prepared command for a lent GPU (issues 36, 49): a smoke stage of under a minute first (the machine's facts and
versions, one exact decode on CUDA against ``generate``, the CUDA tests), then the quick bench of the embedded pair,
then the refiner co-trained on CUDA from a distillation written there, all under one time budget.

    bash scripts/device_run.sh                      # on the device: cuda, about 8 minutes, results under $OUT
    bash scripts/device_run.sh --dry-run            # here and in CI: the same stages on the CPU, tiny (about 70 s of CPU)
    bash scripts/device_run.sh --toy --device cpu   # here: every stage shrunk, a few minutes on one CPU thread
    python scripts/device_run.py --prepare          # here, once: the corpus slice the device run trains from

Everything it needs travels with the working tree except the corpus (``runs/`` is git-ignored): ``--prepare`` writes
a slice of ``runs/corpus/train.bin`` (built from ../shared/data first when missing) to ``runs/device_data/corpus``,
and the DFlash reference's wheel to ``runs/device_data/wheels`` (test_cuda's DFlash 2 case; installed there without
an index), which the device call carries: ``run(command="bash scripts/device_run.sh", carry=["runs/device_data"],
timeout_s=540)``. Without it the training stage is skipped, with the reason, and the other stages still run (the dry
run trains on random ids instead: it checks the plumbing, not the learning).

Each stage is a subprocess bounded by ``timeout`` (its process group is ended at its limit); what it printed goes to
``$OUT/device_run.log`` and ``$OUT/results.json`` is rewritten as each stage ends, so a run cut short still reports
what finished, and a failed smoke stage says so in the first minute. $OUT (default ``runs/device_out``) receives at
most 8 files: the log, results.json, the learning curve (``train_log.jsonl``), the trained drafter with its summary
(``refiner_out.tar.gz``), and the bench's JSON, CSV and table. The work folder (default ``runs/device_work``) keeps
the distillation and the training checkpoint: a second call on the same warm machine resumes both.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEVICE_DATA = Path("runs") / "device_data" / "corpus"
WHEELS = Path("runs") / "device_data" / "wheels"
CORPUS_SLICE_TOKENS = 2_000_000  # 4 MB of uint16 ids: the shuffled corpus's first documents, a fair sample
STAGES = ("decode", "tests", "bench", "train")  # in their order: the smoke stage's two, then the long ones
DEPENDENCIES = ("torch", "transformers", "safetensors", "tokenizers", "numpy", "tqdm", "pytest", "plotly", "gradio")


@dataclass(frozen=True)
class Sizes:
    """What each stage does: the full run on a GPU, or the toy run that checks the plumbing on a CPU."""

    sequences: int
    new_tokens: int
    steps: int
    batch_size: int
    eval_every: int
    train_s: int  # the training stage's share of the budget (distillation, training, evaluation, saving)
    tests_s: int
    bench: tuple[str, ...]
    decode_s: int = 40  # the smoke stage's exact decode
    bench_s: int = 600  # at most; the bench also stops where the training stage's share begins


FULL = Sizes(2048, 96, 4000, 32, 250, 230, 60, ("--quick",), bench_s=150)
TOY = Sizes(
    96,
    24,
    6,
    4,
    3,
    240,
    240,
    ("--quick", "--num-prompts", "2", "--max-new-tokens", "12", "--grid", "K=1 T=1,2 L=8", "--threads", "1"),
)
# The CI's check of the plumbing: every stage, on the CPU, as small as it runs (the held-out rows need 64 sequences).
DRY = Sizes(
    72,
    8,
    2,
    4,
    1,
    60,
    45,
    ("--quick", "--num-prompts", "1", "--max-new-tokens", "8", "--grid", "K=1 T=1 L=4", "--threads", "1"),
    decode_s=60,
    bench_s=60,
)
# About 70 s of CPU on one thread (each stage starts Python, torch and the models afresh); the limits leave room for
# a machine shared with other work.
DRY_BUDGET_S = 180.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (the device run) or cpu (a toy check here)")
    p.add_argument("--toy", action="store_true", help="every stage shrunk: a few steps, a few sequences, 2 prompts")
    p.add_argument("--dry-run", action="store_true", help=f"every stage on the CPU, tiny, in {DRY_BUDGET_S:.0f} s (CI)")
    p.add_argument("--budget", type=float, default=480.0, help="seconds for all stages together (default 8 minutes)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or Path("runs") / "device_out"))
    p.add_argument("--work", type=Path, default=Path("runs") / "device_work", help="distillation and checkpoint")
    p.add_argument("--data", type=Path, help=f"corpus folder (train.bin) to distill from (default {DEVICE_DATA})")
    p.add_argument("--train-args", default="", help="more options for train refiner, e.g. '--rank 256 --passes 5'")
    p.add_argument("--skip", nargs="*", default=[], choices=STAGES, help="stages left out")
    p.add_argument("--prepare", action="store_true", help="write the corpus slice the device run carries, and stop")
    args = p.parse_args(argv)
    if args.dry_run:
        args.device, args.budget = "cpu", min(args.budget, DRY_BUDGET_S)
    return args


def sizes_of(args: argparse.Namespace) -> Sizes:
    return DRY if args.dry_run else TOY if args.toy else FULL


class Run:
    """The log, the results document and the clock every stage shares."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.started = args, time.monotonic()
        args.out.mkdir(parents=True, exist_ok=True)
        self.log_path = args.out / "device_run.log"
        self.results = {"args": {k: str(v) for k, v in vars(args).items()}, "stages": {}}

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.started)

    def note(self, text: str) -> None:
        print(text, flush=True)
        with self.log_path.open("a") as log:
            log.write(text + "\n")

    def record(self, stage: str, result: dict) -> None:
        self.results["stages"][stage] = result
        self.results["elapsed_s"] = round(time.monotonic() - self.started, 1)
        (self.args.out / "results.json").write_text(json.dumps(self.results, indent=1))
        self.note(f"== {stage}: {json.dumps(result)[:400]}")

    def command(self, stage: str, cmd: list[str], limit: float) -> dict:
        """``cmd`` from the repository root, its output appended to the log, ended (its whole process group) after
        ``limit`` seconds or when the budget is spent, whichever comes first."""
        limit = min(limit, self.left())
        if limit < 10:
            return {"status": "skipped", "reason": f"budget spent ({self.left():.0f} s left)"}
        self.note(f"== {stage} (limit {limit:.0f} s): {' '.join(cmd)}")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
        began = time.monotonic()
        with self.log_path.open("a") as log:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                rc = "timeout"
        wall = round(time.monotonic() - began, 1)
        return {"status": "ok" if rc == 0 else "failed", "rc": rc, "wall_s": wall}


def environment(run: Run) -> dict:
    """nvidia-smi, torch and CUDA versions, the GPU torch sees, and which Python packages are missing."""
    facts: dict = {"python": sys.version.split()[0], "installed": install_carried_wheels(), "missing": []}
    for name in DEPENDENCIES:
        if importlib.util.find_spec(name) is None:
            facts["missing"].append(name)
    try:
        smi = subprocess.run(["nvidia-smi"], check=False, capture_output=True, text=True, timeout=30)
        facts["nvidia_smi"] = smi.stdout.strip().splitlines()[:12]
    except (OSError, subprocess.TimeoutExpired) as error:
        facts["nvidia_smi"] = f"not run: {error}"
    import torch

    facts |= {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    import transformers

    facts["transformers"] = transformers.__version__
    return facts


def training(run: Run, sizes: Sizes) -> dict:
    """``train refiner --co-train`` on the device: distillation written there first (resumable), then training
    bounded by ``--max-minutes``; the learning curve and the trained drafter go to $OUT."""
    args = run.args
    data = args.data or (dry_corpus(args.work) if args.dry_run else DEVICE_DATA)
    if not (data / "train.bin").exists():
        return {
            "status": "skipped",
            "reason": f"no {data}/train.bin: run scripts/device_run.py --prepare here and "
            "carry runs/device_data (runs/ is git-ignored and does not travel)",
        }
    stage_s = min(sizes.train_s, run.left() - 5)
    workdir, out = args.work / "refiner", args.work / "refiner" / "out"
    # The loop's own clock: what is left once the target loads and writes the distillation, and before the last
    # evaluation and the save (both short next to the loop; the distillation's share is a guess, kept generous).
    loop_minutes = max(0.2, (stage_s * 0.6 - 20) / 60)
    cmd = [
        sys.executable,
        # The recipe of the CPU run (docs/experiments.md, "Co-training the refiner (issue 36)"): the drafter at a
        # tenth of the head's rate, three free passes at full weight.
        *["-m", "xpress_core", "train", "refiner", "--co-train", "--device", args.device],
        *["--drafter-lr", "0.1", "--lr", "1e-3", "--passes", "3", "--free-weight", "1.0"],
        *["--target", "assets/target", "--drafter", "assets/drafter", "--data", str(data)],
        *["--distill-dir", str(args.work / "distill"), "--sequences", str(sizes.sequences)],
        *["--new-tokens", str(sizes.new_tokens), "--workdir", str(workdir), "--out", str(out)],
        *["--steps", str(sizes.steps), "--batch-size", str(sizes.batch_size), "--eval-every", str(sizes.eval_every)],
        *["--max-minutes", f"{loop_minutes:.2f}", *args.train_args.split()],
    ]
    result = run.command("train", cmd, stage_s)
    if (workdir / "train_log.jsonl").exists():
        shutil.copy(workdir / "train_log.jsonl", args.out / "train_log.jsonl")
    if (out / "training_summary.json").exists():
        summary = json.loads((out / "training_summary.json").read_text())
        result["summary"] = {k: summary.get(k) for k in ("steps", "resumed_from", "wall_s", "refiner_recipe")}
        result["heldout_accepted"] = {
            rows: [p["accepted"] for p in summary["heldout_refiner"][rows]["passes"]] for rows in ("greedy", "sampled")
        }
        with tarfile.open(args.out / "refiner_out.tar.gz", "w:gz") as tar:
            tar.add(out, arcname="refiner_out")
    return result


def dry_corpus(work: Path) -> Path:
    """The dry run's corpus: random ids of the embedded target's vocabulary (enough for its few sequences)."""
    import numpy as np

    folder = work / "dry_corpus"
    if not (folder / "train.bin").exists():
        vocab = json.loads((ROOT / "assets" / "target" / "config.json").read_text())["vocab_size"]
        folder.mkdir(parents=True, exist_ok=True)
        np.random.default_rng(0).integers(10, vocab, size=200_000, dtype=np.uint16).tofile(folder / "train.bin")
    return folder


def exact_decode(run: Run, sizes: Sizes) -> dict:
    """Smoke: one decode of the embedded pair through the CLI on the device, against ``generate`` there."""
    cmd = [sys.executable, "scripts/exact_decode.py", "--device", run.args.device, "--decodes", "1"]
    return run.command("decode", cmd, sizes.decode_s)


def cuda_tests(run: Run, sizes: Sizes) -> dict:
    """Smoke: the CUDA cases of tests/test_cuda.py (their CPU cases ran in the suite; without CUDA all skip)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-x", "-p", "no:cacheprovider", "tests/test_cuda.py"]
    return run.command("tests", [*cmd, "-k", "not cpu"], sizes.tests_s)


def bench(run: Run, sizes: Sizes) -> dict:
    """``bench --quick`` of the embedded pair on the device; its JSON, CSV and table go to $OUT."""
    json_path = run.args.work / "bench" / "bench.json"
    cmd = [sys.executable, "-m", "xpress_core", "bench", *sizes.bench, "--device", run.args.device]
    limit = min(sizes.bench_s, run.left() - min(sizes.train_s, run.left() / 2))  # the training stage's share kept
    result = run.command("bench", [*cmd, "--json", str(json_path), "--no-progress"], limit)
    for path in (json_path, json_path.with_suffix(".csv"), json_path.with_name("bench_table.md")):
        if path.exists():
            shutil.copy(path, run.args.out / path.name)
    if json_path.exists():
        doc = json.loads(json_path.read_text())
        result["best"], result["machine"], result["mismatches"] = doc["best"], doc["machine"], len(doc["mismatches"])
    return result


def prepare(args: argparse.Namespace) -> None:
    """Here, before a device call: the first ``CORPUS_SLICE_TOKENS`` ids of the corpus, built first if missing."""
    import numpy as np

    corpus = Path("runs") / "corpus"
    if not (ROOT / corpus / "train.bin").exists():
        cmd = [sys.executable, "-m", "xpress_core", "train", "corpus", "--tokenizer", "assets/target"]
        subprocess.run([*cmd, "--out", str(corpus)], cwd=ROOT, check=True)
    tokens = np.fromfile(ROOT / corpus / "train.bin", dtype=np.uint16)[:CORPUS_SLICE_TOKENS]
    target = ROOT / (args.data or DEVICE_DATA)
    target.mkdir(parents=True, exist_ok=True)
    tokens.tofile(target / "train.bin")
    print(json.dumps({"corpus_slice": str(target / "train.bin"), "tokens": int(tokens.size)}))
    # The DFlash reference package (tests/test_cuda.py's DFlash 2 case) as a wheel: the device reaches no index.
    requirement = next(
        line for line in (ROOT / "requirements-test.txt").read_text().splitlines() if line[:6] == "dflash"
    )
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(WHEELS), requirement]
    subprocess.run(cmd, cwd=ROOT, check=True)


def install_carried_wheels() -> list[str]:
    """On the device: the wheels ``--prepare`` carried, installed without their dependencies where missing."""
    wheels = sorted((ROOT / WHEELS).glob("*.whl")) if (ROOT / WHEELS).is_dir() else []
    names = [w.name for w in wheels if importlib.util.find_spec(w.name.split("-")[0]) is None]
    if names:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
        subprocess.run([*cmd, *(str(ROOT / WHEELS / n) for n in names)], check=False, timeout=120)
    return names


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.prepare:
        prepare(args)
        return 0
    if args.out.exists():  # $OUT is emptied on the device; a local rerun starts clean too
        for stale in args.out.iterdir():
            stale.unlink() if stale.is_file() else shutil.rmtree(stale)
    run = Run(args)
    sizes = sizes_of(args)
    run.record("environment", environment(run))
    stages = {"decode": exact_decode, "tests": cuda_tests, "bench": bench, "train": training}
    for name, stage in stages.items():
        run.record(name, {"status": "skipped", "reason": "--skip"} if name in args.skip else stage(run, sizes))
    failed = [n for n, r in run.results["stages"].items() if r.get("status") == "failed"]
    run.note(f"== done in {time.monotonic() - run.started:.0f} s; files in {args.out}; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
