"""Scale (issue 15): pre-training from streamed pair shards against the in-memory path, on this machine.

    python benchmarks/scale.py [--sizes 10000 100000] [--steps 200] [--batch 8] [--extract 200]

1. writes the shapes world (``--sizes`` images, 64 px, the train split's 5 captions per image) as pixel shards
   (`vlkit.data.shards.write_shards`, what ``vlkit make-shards source=shapes`` does);
2. memory: pre-trains a tiny METER (MLM) for ``--steps`` steps from the stream of each size, one process each,
   and records the peak resident memory (flat in the number of images: the stream holds row positions and a
   few row groups, never the data set);
3. resume: a streamed run killed (SIGKILL) right after its mid-run checkpoint, resumed with ``resume=true``,
   against an uninterrupted run: the losses of every step;
4. throughput per process, examples/s after the first 20 steps: the stream (``data=shards``) against the
   in-memory path (``data=shapes``, images rendered and cached), in 1 process and in 2 gloo processes
   (``accelerate launch``, each rank its own batches);
5. extraction (``--extract`` images, the shipped shapes detector): 1 process against ``processes=2``
   (the same features per id, images/s over all processes).

Prints a table and writes benchmarks/results/scale.json. Everything runs on the CPU, single-threaded per process.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
IMAGE = {"size": 64, "patch_size": 8, "transform": "vit", "cache": True}
WARMUP = 20


def make_shards(n: int, out: Path) -> dict:
    from vlkit.data.shapes import ShapesWorld
    from vlkit.data.shards import read_manifest, shapes_png, shapes_records, write_shards

    if (out / "shards.json").exists():
        return {"images": n, "rows": read_manifest(out)["rows"], "seconds": None}
    world = ShapesWorld(seed=0, num_images=n, image_size=64)
    start = time.perf_counter()
    write_shards(shapes_records(world), out, shard_size=2000, row_group_size=250,
                 image_bytes=shapes_png(world), source="shapes")
    return {"images": n, "rows": read_manifest(out)["rows"], "seconds": time.perf_counter() - start}


def _dataset(kind: str, n: int, shards: Path | None):
    from vlkit.data.stream import StreamedPairs  # noqa: F401 - registers data=shards
    from vlkit.registry import DATASETS

    common = {"tokenizer": "shapes", "max_len": 40, "on_error": "raise"}
    if kind == "stream":
        return DATASETS.get("shards")({**common, "name": "shards", "path": str(shards), "buffer_size": 1000,
                                       "image": {**IMAGE, "source": "shards"}})
    return DATASETS.get("shapes")({**common, "name": "shapes", "seed": 0, "num_images": n, "image_size": 64,
                                   "split": "train", "image": {**IMAGE, "source": "shapes"}})


class _Timed:
    """Wraps the training module's forward: a timestamp per step, and a SIGKILL at ``kill_at``."""

    def __init__(self, kill_at: int | None):
        self.kill_at, self.times = kill_at, []

    def wrap(self, module):
        forward = module.forward

        def timed(batch, step=0, micro_step=None):
            if self.kill_at is not None and step == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # a real kill, between two checkpoints
            self.times.append(time.perf_counter())
            return forward(batch, step, micro_step)

        module.forward = timed
        return module


def one(args) -> dict:
    """One training process (``--one``): prints a JSON line with its figures."""
    import torch

    import vlkit
    from vlkit.objectives import build_pretraining
    from vlkit.train import Trainer

    torch.set_num_threads(1)
    dataset = _dataset(args.kind, args.images, args.shards)
    tok = dataset.tokenizer
    torch.manual_seed(0)
    model = vlkit.build_model("meter", preset="tiny", vocab_size=len(tok))
    timer = _Timed(args.kill_at)
    module = timer.wrap(build_pretraining(model, {"objectives": {"mlm": {}}}, tokenizer=tok, seed=0))
    trainer = Trainer(module, dict(output_dir=str(args.output), max_steps=args.steps, seed=0, lr=1e-3, warmup=0,
                                   batch_size=args.batch, cpu=True, trackers=[], progress=False,
                                   save_every=args.save_every, keep_checkpoints=0, resume=args.resume,
                                   split_batches=False))
    result = trainer.fit(trainer.loader(dataset))
    times = timer.times
    steady = times[WARMUP:] if len(times) > WARMUP + 1 else times
    rate = args.batch * (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0
    out = {"kind": args.kind, "images": args.images, "rank": trainer.rank, "world_size": trainer.world_size,
           "steps": len(times), "examples_per_s": rate,
           "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "losses": [r["loss"] for r in result.history]}
    from vlkit.train.distributed import shutdown

    shutdown()
    return out


def _worker_args(kind: str, n: int, shards: Path | None, output: Path, steps: int, batch: int, **kw) -> list[str]:
    args = [str(Path(__file__).resolve()), "--one", "--kind", kind, "--images", str(n), "--output", str(output),
            "--steps", str(steps), "--batch", str(batch)]
    if shards is not None:
        args += ["--shards", str(shards)]
    for key, value in kw.items():
        if value is not None and value is not False:
            args += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return args


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def run_one(*worker, processes: int = 1, check: bool = True) -> list[dict]:
    if processes == 1:
        cmd = [sys.executable, *worker]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(port), *worker]
    proc = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return _lines(proc.stdout)


def bench_extract(n: int, root: Path) -> dict:
    import numpy as np

    from vlkit.data.shapes import ShapesWorld
    from vlkit.features.store import FeatureStore

    world = ShapesWorld(seed=1, num_images=n, image_size=128)
    folder = root / "images"
    folder.mkdir(exist_ok=True)
    for i in range(n):
        world.image(i).save(folder / f"{world.image_id(i)}.png")
    out = {}
    for processes, target in ((1, root / "one.h5"), (2, root / "two")):
        cmd = [sys.executable, "-m", "vlkit.cli", "extract-features", f"images={folder}", f"out={target}",
               "device=cpu", "threads=1", "dtype=float32", f"processes={processes}", "progress=false"]
        start = time.perf_counter()
        subprocess.run(cmd, env=_env(), cwd=REPO, check=True, capture_output=True)
        out[f"processes_{processes}"] = {"seconds": time.perf_counter() - start,
                                         "images_per_s": n / (time.perf_counter() - start)}
    a, b = FeatureStore(root / "one.h5"), FeatureStore(root / "two")
    out["equal_per_id"] = sorted(a.ids()) == sorted(b.ids()) and all(
        np.array_equal(a.load(i, num_bb=1000).features, b.load(i, num_bb=1000).features) for i in a.ids())
    out["images"] = n
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--extract", type=int, default=200, help="images for the extraction figures (0: skip)")
    p.add_argument("--work", type=Path, default=None, help="where shards and runs go (default: a temp dir)")
    p.add_argument("--out", type=Path, default=RESULTS / "scale.json")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kind", default="stream", help=argparse.SUPPRESS)
    p.add_argument("--images", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--shards", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--output", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--kill-at", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--save-every", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args)), flush=True)
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="vlkit-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    report: dict = {"meta": {"steps": args.steps, "batch": args.batch, "sizes": args.sizes, "model": "meter tiny, MLM",
                             "cpu_count": os.cpu_count(), "load_avg": os.getloadavg()}}
    small, large = min(args.sizes), max(args.sizes)
    report["shards"] = {n: make_shards(n, work / f"shards_{n}") for n in args.sizes}
    print("shards", json.dumps(report["shards"]), flush=True)
    report["memory"] = {n: run_one(*_worker_args("stream", n, work / f"shards_{n}", work / f"mem_{n}", args.steps,
                                                 args.batch))[0] for n in args.sizes}
    for n, r in report["memory"].items():
        r.pop("losses")
        print(f"memory  stream {n:>7} images: peak RSS {r['max_rss_mb']:.0f} MB, {r['examples_per_s']:.1f} ex/s", flush=True)

    half = args.steps // 2
    shards = work / f"shards_{small}"
    straight = run_one(*_worker_args("stream", small, shards, work / "straight", args.steps, args.batch))[0]
    run_one(*_worker_args("stream", small, shards, work / "cut", args.steps, args.batch, save_every=half,
                          kill_at=half + 3), check=False)
    killed = sorted(p.name for p in (work / "cut" / "checkpoints").iterdir())
    resumed = run_one(*_worker_args("stream", small, shards, work / "cut", args.steps, args.batch,
                                    save_every=half, resume=True))[0]
    report["resume"] = {"killed_at_step": half + 4, "checkpoints_left": killed, "resumed_steps": len(resumed["losses"]),
                        "identical": resumed["losses"] == straight["losses"][half:],
                        "max_abs_diff": max(abs(a - b) for a, b in zip(resumed["losses"], straight["losses"][half:]))}
    print("resume", json.dumps(report["resume"]), flush=True)

    rows = []
    for processes in (1, 2):
        for kind in ("memory", "stream"):
            got = run_one(*_worker_args(kind, small, shards if kind == "stream" else None,
                                        work / f"tp_{kind}_{processes}", args.steps, args.batch), processes=processes)
            rate = sum(r["examples_per_s"] for r in got) / len(got)
            rows.append({"processes": processes, "kind": kind, "examples_per_s_per_process": rate,
                         "max_rss_mb": max(r["max_rss_mb"] for r in got)})
            print(f"throughput {kind:>6} {processes} process(es): {rate:.1f} examples/s per process", flush=True)
    for processes in (1, 2):
        mem, st = (next(r for r in rows if r["processes"] == processes and r["kind"] == k) for k in ("memory", "stream"))
        st["ratio_to_memory"] = st["examples_per_s_per_process"] / mem["examples_per_s_per_process"]
    report["throughput"] = rows
    if args.extract:
        report["extract"] = bench_extract(args.extract, work / "extract")
        print("extract", json.dumps(report["extract"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out} (work dir {work})")


if __name__ == "__main__":
    main()
