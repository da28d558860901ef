"""Peak training memory per sample of each family's base preset (batch 32 by default), without and with
activation checkpointing, on the CPU (resident set size) or a GPU (allocated memory).

    python benchmarks/memory.py [--families vilbert uniter meter] [--batch 32] [--device cpu|cuda]

Each (family, mode) runs in its own process: build the pre-training module (the family's objective
mix) and the official AdamW, one warm-up step (gradients and optimizer state allocated), then one
measured step. ``step_mb`` = peak during the measured step minus the memory before it (the activations
and temporaries of forward + backward); per sample = ``step_mb / batch``. The two modes' losses are
compared (checkpointing recomputes with the same dropout draws). Prints a table, writes
benchmarks/results/memory.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PRESET = {"vilbert": "base", "uniter": "base", "meter": "clip16-roberta"}
MIX = {"vilbert": "vilbert", "meter": "meter",  # UNITER: its MLM pass and its ITM + WRA pass in one step
       "uniter": {"sampling": "sum", "masking": "conditional", "objectives": {"mlm": {}, "itm": {"wra": {"weight": 0.1}}}}}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(family: str, checkpointing: bool, batch: int, device: str, threads: int, tiny: bool = False) -> dict:
    import torch

    import vlkit
    from vlkit.objectives import build_pretraining
    from vlkit.train.optim import build_optimizer

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    overrides = {"image_size": 224} if family == "meter" and not tiny else {}
    model = vlkit.build_model(family, preset="tiny" if tiny else PRESET[family], **overrides).to(device)
    pre = build_pretraining(model, MIX[family]).to(device).train()
    if checkpointing:
        model.set_activation_checkpointing()
    data = model.example_batch(batch_size=batch, text_len=40, num_regions=36, seed=1)
    data = data.replace(image_ids=[str(i) for i in range(batch)])
    optimizer = build_optimizer(pre, 1e-5, rule="hf")

    def step(seed: int) -> float:
        torch.manual_seed(seed)
        loss = pre(data, step=seed).loss
        loss.backward()
        optimizer.step()
        pre.zero_grad(set_to_none=False)  # keep the gradient buffers: they are not activations
        return loss.item()

    step(0)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
    else:
        before = _rss_mb()
    t = time.perf_counter()
    loss = step(1)
    seconds = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"family": family, "preset": PRESET[family], "batch": batch, "checkpointing": checkpointing,
            "device": device, "loss": loss, "before_mb": before, "peak_mb": peak, "step_mb": peak - before,
            "mb_per_sample": (peak - before) / batch, "step_s": seconds, "threads": torch.get_num_threads()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", default=list(PRESET), choices=list(PRESET))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "memory.json")
    p.add_argument("--tiny", action="store_true", help="tiny presets (a quick check of the script)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        family, mode = args.one.split(",")
        print(json.dumps(measure(family, mode == "checkpointed", args.batch, args.device, args.threads, args.tiny)))
        return
    rows = []
    for family in args.families:
        for mode in ("plain", "checkpointed"):
            cmd = [sys.executable, __file__, "--one", f"{family},{mode}", "--batch", str(args.batch), "--device",
                   args.device, "--threads", str(args.threads)] + (["--tiny"] if args.tiny else [])
            env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                       PYTHONPATH=str(Path(__file__).resolve().parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode:
                rows.append({"family": family, "checkpointing": mode == "checkpointed", "error": proc.stderr[-500:]})
                print(f"{family} {mode}: FAILED {proc.stderr[-300:]}", flush=True)
                continue
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{family:8} {mode:13} batch {r['batch']}: {r['step_mb']:8.0f} MB for the step, "
                  f"{r['mb_per_sample']:6.1f} MB/sample, loss {r['loss']:.6f}, {r['step_s']:.1f} s", flush=True)
    for family in args.families:
        pair = [r for r in rows if r["family"] == family and "error" not in r]
        if len(pair) == 2:
            plain, ckpt = sorted(pair, key=lambda r: r["checkpointing"])
            ckpt["saving"] = 1 - ckpt["step_mb"] / plain["step_mb"]
            ckpt["same_loss"] = ckpt["loss"] == plain["loss"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "platform": platform.platform(), "command": " ".join(sys.argv)}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
