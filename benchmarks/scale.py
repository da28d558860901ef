"""Scale (issue 15): pre-training from streamed pair shards against the in-memory path, on this machine.

    python benchmarks/scale.py [--sizes 10000 100000] [--steps 200] [--batch 8] [--extract 200]

1. writes the shapes world (``--sizes`` images, 64 px, the train split's 5 captions per image) as pixel shards
   (`vlkit.data.shards.write_shards`, what ``vlkit make-shards source=shapes`` does);
2. memory: pre-trains a tiny METER (MLM) for ``--steps`` steps from the stream of each size, one process each,
   and records the peak resident memory (flat in the number of images: the stream holds row positions and a
   few row groups, never the data set);
3. resume: a streamed run killed (SIGKILL) right after its mid-run checkpoint, resumed with ``resume=true``,
   against an uninterrupted run: the losses of every step;
4. throughput per process, examples/s after the first 20 steps (a quarter of shorter runs): the stream (``data=shards``) against the
   in-memory path (``data=shapes``, images rendered and cached), in 1 process and in 2 gloo processes
   (``accelerate launch``, each rank its own batches);
5. extraction (``--extract`` images, the shipped shapes detector): 1 process against ``processes=2``
   (the same features per id, images/s over all processes).

``--data-only``: only the data path (no model): the stream and the in-memory pairs of each size in parallel
processes, their resident memory and examples per CPU-second (a measure that holds on a busy shared machine).

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
WARMUP = 20  # steps left out of the throughput (at most a quarter of the run)


def make_shards(n: int, out: Path) -> dict:
    from vlkit.data.shapes import ShapesWorld
    from vlkit.data.shards import read_manifest, shapes_png, shapes_records, write_shards

    if (out / "shards.json").exists():
        return {"images": n, "rows": read_manifest(out)["rows"], "seconds": None}
    world = ShapesWorld(seed=0, num_images=n, image_size=64)
    start = time.perf_counter()
    write_shards(shapes_records(world), out, shard_size=2000, row_group_size=250,
                 image_bytes=shapes_png(world), source="shapes", overwrite=True)  # no finished set there
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
        self.kill_at, self.times, self.cpu = kill_at, [], []

    def wrap(self, module):
        forward = module.forward

        def timed(batch, step=0, micro_step=None):
            if self.kill_at is not None and step == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # a real kill, between two checkpoints
            self.times.append(time.perf_counter())
            self.cpu.append(time.process_time())
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
    first = min(WARMUP, len(timer.times) // 4)
    steady, cpu = timer.times[first:], timer.cpu[first:]
    rate = args.batch * (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0
    cpu_rate = args.batch * (len(cpu) - 1) / (cpu[-1] - cpu[0]) if len(cpu) > 1 else 0.0
    out = {"kind": args.kind, "images": args.images, "rank": trainer.rank, "world_size": trainer.world_size,
           "steps": len(timer.times), "examples_per_s": rate, "examples_per_cpu_s": cpu_rate,
           "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "losses": [r["loss"] for r in result.history]}
    from vlkit.runtime import shutdown

    shutdown()
    return out


def data_one(args) -> dict:
    """One data-path process (``--one --data-only``): ``--steps`` batches of ``--batch`` from the stream or the
    in-memory pairs, one process, no model; examples per CPU-second (robust on a shared, busy machine) and per
    wall-second after the first quarter, and the resident memory before and after."""
    import torch

    torch.set_num_threads(1)
    rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # noqa: E731
    base = rss()
    cpu0 = time.process_time()
    dataset = _dataset(args.kind, args.images, args.shards)
    build_cpu = time.process_time() - cpu0
    built = rss()
    if args.kind == "stream":
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, collate_fn=dataset.collator())
    else:
        from vlkit.data.batching import FixedSizeBatchSampler

        sampler = FixedSizeBatchSampler(len(dataset), args.batch, seed=0, shuffle=True, drop_last=True)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=dataset.collator())
    marks = []
    for k, batch in enumerate(loader):
        marks.append((time.process_time(), time.perf_counter()))
        if k + 1 == args.steps:
            break
    first = len(marks) // 4
    n = args.batch * (len(marks) - 1 - first)
    return {"kind": args.kind, "images": args.images, "batches": len(marks), "build_cpu_s": build_cpu,
            "examples_per_cpu_s": n / (marks[-1][0] - marks[first][0]),
            "examples_per_wall_s": n / (marks[-1][1] - marks[first][1]),
            "rss_after_imports_mb": base, "rss_after_build_mb": built, "max_rss_mb": rss()}


def data_only(args, work: Path) -> dict:
    """The data path in parallel processes (stream / in-memory x each size): memory and CPU-time throughput."""
    procs = {}
    for n in args.sizes:
        for kind in ("stream", "memory"):
            worker = _worker_args(kind, n, work / f"shards_{n}" if kind == "stream" else None, work / "unused",
                                  args.steps, args.batch, data_only=True)
            procs[(kind, n)] = subprocess.Popen([sys.executable, *worker], env=_env(), cwd=REPO,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rows = []
    for (kind, n), proc in procs.items():
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"data path {kind} {n} failed ({proc.returncode}):\n{err[-3000:]}")
        rows.append(_lines(out)[0])
        r = rows[-1]
        print(f"data {kind:>6} {n:>7} images: RSS {r['rss_after_build_mb']:.0f} MB built, {r['max_rss_mb']:.0f} MB peak; "
              f"{r['examples_per_cpu_s']:.0f} examples per CPU-s; built in {r['build_cpu_s']:.1f} CPU-s", flush=True)
    return {"rows": rows}


def training_parallel(args, work: Path) -> dict:
    """Training figures with the runs side by side (a busy shared machine: throughput per CPU-second):
    the stream and the in-memory path in 1 and 2 processes, and a streamed run killed (SIGKILL) after its
    mid-run checkpoint then resumed, against the uninterrupted stream run."""
    n, half = min(args.sizes), args.steps // 2
    shards = work / f"shards_{n}"

    def start(kind, output, processes=1, **kw):
        worker = _worker_args(kind, n, shards if kind == "stream" else None, output, args.steps, args.batch, **kw)
        cmd = [sys.executable, *worker]
        if processes > 1:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                   str(processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                   "--main_process_port", str(port), *worker]
        return subprocess.Popen(cmd, env=_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(proc, check=True):
        out, err = proc.communicate()
        if check and proc.returncode != 0:
            raise RuntimeError(f"{proc.args} failed ({proc.returncode}):\n{err[-3000:]}")
        return _lines(out)

    runs = {(kind, p): start(kind, work / f"tp_{kind}_{p}", p) for p in args.processes for kind in ("stream", "memory")}
    cut = start("stream", work / "cut", save_every=half, kill_at=half + 3)
    finish(cut, check=False)
    killed = sorted(q.name for q in (work / "cut" / "checkpoints").iterdir())
    resumed = finish(start("stream", work / "cut", save_every=half, resume=True))[0]
    rows = []
    for (kind, p), proc in runs.items():
        got = finish(proc)
        rows.append({"kind": kind, "processes": p, "examples_per_cpu_s_per_process":
                     sum(r["examples_per_cpu_s"] for r in got) / len(got),
                     "examples_per_wall_s_per_process": sum(r["examples_per_s"] for r in got) / len(got),
                     "max_rss_mb": max(r["max_rss_mb"] for r in got), "losses_rank0": got[0]["losses"]})
        print(f"train {kind:>6} {p} process(es): {rows[-1]['examples_per_cpu_s_per_process']:.1f} examples per "
              "CPU-s per process", flush=True)
    straight = next(r for r in rows if r["kind"] == "stream" and r["processes"] == 1)["losses_rank0"]
    resume = {"steps": args.steps, "killed_after_step": half + 3, "checkpoints_left": killed,
              "resumed_steps": len(resumed["losses"]), "identical": resumed["losses"] == straight[half:],
              "max_abs_diff": max(abs(a - b) for a, b in zip(resumed["losses"], straight[half:]))}
    print("resume", json.dumps(resume), flush=True)
    for r in rows:
        r.pop("losses_rank0")
    return {"throughput": rows, "resume": resume}


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
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="--training-parallel: process counts")
    p.add_argument("--training-parallel", action="store_true",
                   help="the training figures with the runs side by side, throughput per CPU-second")
    p.add_argument("--data-only", action="store_true",
                   help="only the data path (stream vs in-memory, memory and examples per CPU-second), no training")
    args = p.parse_args()
    if args.one:
        print(json.dumps(data_one(args) if args.data_only else one(args)), flush=True)
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="vlkit-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    report: dict = {"meta": {"steps": args.steps, "batch": args.batch, "sizes": args.sizes, "model": "meter tiny, MLM",
                             "cpu_count": os.cpu_count(), "load_avg": os.getloadavg()}}
    small = min(args.sizes)
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every stage: a stopped run keeps what it measured
        args.out.write_text(json.dumps(report, indent=1))

    report["shards"] = {n: make_shards(n, work / f"shards_{n}") for n in args.sizes}
    print("shards", json.dumps(report["shards"]), flush=True)
    if args.training_parallel:
        report["training"] = training_parallel(args, work)
        save()
        print(f"wrote {args.out} (work dir {work})")
        return
    if args.data_only:
        report["data"] = data_only(args, work)
        save()
        print(f"wrote {args.out} (work dir {work})")
        return
    report["memory"] = {n: run_one(*_worker_args("stream", n, work / f"shards_{n}", work / f"mem_{n}", args.steps,
                                                 args.batch))[0] for n in args.sizes}
    for n, r in report["memory"].items():
        r.pop("losses")
        print(f"memory  stream {n:>7} images: peak RSS {r['max_rss_mb']:.0f} MB, {r['examples_per_s']:.1f} ex/s", flush=True)
    save()

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
    save()

    rows = []
    for processes in (1, 2):
        for kind in ("memory", "stream"):
            got = run_one(*_worker_args(kind, small, shards if kind == "stream" else None,
                                        work / f"tp_{kind}_{processes}", args.steps, args.batch), processes=processes)
            rate = sum(r["examples_per_s"] for r in got) / len(got)
            rows.append({"processes": processes, "kind": kind, "examples_per_s_per_process": rate,
                         "max_rss_mb": max(r["max_rss_mb"] for r in got)})
            print(f"throughput {kind:>6} {processes} process(es): {rate:.1f} examples/s per process", flush=True)
            report["throughput"] = rows
            save()
    for processes in (1, 2):
        mem, st = (next(r for r in rows if r["processes"] == processes and r["kind"] == k) for k in ("memory", "stream"))
        st["ratio_to_memory"] = st["examples_per_s_per_process"] / mem["examples_per_s_per_process"]
    report["throughput"] = rows
    if args.extract:
        report["extract"] = bench_extract(args.extract, work / "extract")
        print("extract", json.dumps(report["extract"]), flush=True)
    save()
    print(f"wrote {args.out} (work dir {work})")


if __name__ == "__main__":
    main()
