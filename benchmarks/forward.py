"""Forward+backward throughput (samples/s) and peak memory of each family, eager vs torch.compile.

    python benchmarks/forward.py                       # tiny + base, eager + compiled, CPU or GPU
    python benchmarks/forward.py --presets tiny --no-compile

Each configuration runs in its own subprocess so that the peak memory is its own (peak RSS on CPU,
``torch.cuda.max_memory_allocated`` on GPU). Prints a table, writes benchmarks/results/forward.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
BASE_PRESET = {"vilbert": "base", "uniter": "base", "meter": "clip16-roberta"}


def run_one(family: str, preset: str, compiled: bool, batch_size: int, steps: int, device: str) -> dict:
    import torch

    import vlkit

    torch.manual_seed(0)
    model = vlkit.build_model(family, preset=BASE_PRESET[family] if preset == "base" else preset).to(device).train()
    batch = model.example_batch(batch_size=batch_size, text_len=40, num_regions=36)
    step_fn = torch.compile(model) if compiled else model

    def step() -> None:
        out = step_fn(batch)
        (out.joint.float().sum() + out.text_states.float().mean()).backward()
        model.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    step()  # warm-up (compilation happens here)
    warmup = time.perf_counter() - t0
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"family": family, "preset": preset, "mode": "compile" if compiled else "eager", "device": device,
            "batch_size": batch_size, "steps": steps, "params": sum(p.numel() for p in model.parameters()),
            "samples_per_s": batch_size * steps / elapsed, "first_step_s": warmup, "peak_mem_mb": peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=["vilbert", "uniter", "meter"])
    parser.add_argument("--presets", nargs="+", default=["tiny", "base"])
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--batch-size", type=int, default=None, help="default: 32 for tiny, 4 (CPU) / 32 (GPU) for base")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # child process: one configuration, JSON on stdout
        family, preset, mode, bs, steps, device = args.one.split(",")
        print(json.dumps(run_one(family, preset, mode == "compile", int(bs), int(steps), device)))
        return

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    modes = ["eager"] if args.no_compile else ["eager", "compile"]
    rows = []
    for preset in args.presets:
        for family in args.families:
            for mode in modes:
                bs = args.batch_size or (32 if preset == "tiny" or device == "cuda" else 4)
                steps = args.steps or (20 if preset == "tiny" else 3)
                cmd = [sys.executable, __file__, "--one", f"{family},{preset},{mode},{bs},{steps},{device}"]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    rows.append({"family": family, "preset": preset, "mode": mode, "error": proc.stderr.strip()[-300:]})
                    print(f"{family:8} {preset:5} {mode:8} FAILED: {rows[-1]['error']}")
                    continue
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
                r = rows[-1]
                print(f"{family:8} {preset:5} {mode:8} bs={bs:<3} {r['samples_per_s']:9.1f} samples/s "
                      f"peak {r['peak_mem_mb']:8.0f} MB  first step {r['first_step_s']:.1f}s", flush=True)
    for r in rows:  # compile speed-up measured against the eager run of the same configuration
        eager = next((e for e in rows if e.get("mode") == "eager" and e["family"] == r["family"]
                      and e["preset"] == r["preset"] and "samples_per_s" in e), None)
        if eager and "samples_per_s" in r:
            r["speedup_vs_eager"] = r["samples_per_s"] / eager["samples_per_s"]
    RESULTS.mkdir(exist_ok=True)
    meta = {"torch": torch.__version__, "device": device, "machine": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads()}
    (RESULTS / "forward.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"\nwrote {RESULTS / 'forward.json'}")


if __name__ == "__main__":
    main()
