"""The devices a plan can be made for: dense peak FLOP rates per precision from the vendors' datasheets, and a
default model FLOP utilisation (MFU) per device from a published training run, set once per device and never
tuned per family. Hours = FLOPs / (peak x MFU). ``cpu`` is this machine: its peak is measured (`gemm_rate`).

Peaks (TFLOPS, dense, no sparsity):
- V100 SXM2: NVIDIA Tesla V100 datasheet (fp32 15.7, fp16 tensor 125).
- A100 SXM4: NVIDIA A100 datasheet (fp32 19.5, tf32 156, bf16 / fp16 312).
- H100 SXM5 and H200: NVIDIA H100 / H200 datasheets (fp32 67, tf32 494.7, bf16 / fp16 989.4; the H200 has the
  H100's compute with more memory).
- L4: NVIDIA L4 datasheet (fp32 30.3, tf32 60, bf16 / fp16 121).
- TITAN X (Pascal), ViLBERT's GPU: NVIDIA's specification, fp32 11.0 (its fp16 runs at 1/64 rate: not offered).

MFU defaults, the model FLOPs a large training run achieved as a share of the peak:
- V100: 21.3%, GPT-3 on V100s (Chowdhery et al. 2022, PaLM, Table 3).
- A100: 30.2%, Megatron-Turing NLG 530B on A100s (the same table).
- H100, H200: 38%, Llama 3 405B in BF16 on H100s (Dubey et al. 2024, The Llama 3 Herd of Models, Table 4:
  38-43%; the lowest).
- L4, TITAN X: no published training run; the V100's figure, the lowest of the table.
- cpu: 30%, the share of this machine's GEMM rate a tiny vlkit training step reaches
  (`benchmarks/step_efficiency.py`: 24-36% for the three families, benchmarks/results/step_efficiency.json).
Small vision-and-language models at short sequences reach less than these large language models (no paper's
reported time is traced to its recipe: docs/compare-plans.md), so set ``compare.plan.mfu`` from a run of your own
(`vlkit compare-report` gives the MFU a finished comparison achieved).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from vlkit.runtime import gemm_gflops

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
TRAINER_PRECISION = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}  # trainer.mixed_precision -> the GEMMs' precision


@dataclass(frozen=True)
class Device:
    name: str
    peaks: dict[str, float] = field(default_factory=dict)  # precision -> dense peak, TFLOPS
    mfu: float = 0.0
    mfu_source: str = ""

    def peak(self, precision: str) -> float:
        """The dense peak in FLOP/s at ``precision``; a precision the device does not run is an error."""
        if precision not in self.peaks:
            raise ValueError(f"compare.plan.device={self.name} has no {precision} peak (it runs "
                             f"{', '.join(self.peaks)}); set compare.plan.precision or the trainer's mixed_precision")
        return self.peaks[precision] * 1e12


_HOPPER = {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}
_LLAMA3 = "Llama 3 405B, BF16 on H100 (Dubey et al. 2024, Table 4: 38-43%)"
_GPT3 = "GPT-3 on V100 (Chowdhery et al. 2022, PaLM, Table 3)"
DEVICES = {d.name: d for d in (
    Device("v100", {"fp32": 15.7, "fp16": 125.0}, 0.213, _GPT3),
    Device("a100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}, 0.302,
           "Megatron-Turing NLG 530B on A100 (Chowdhery et al. 2022, PaLM, Table 3)"),
    Device("h100", _HOPPER, 0.38, _LLAMA3),
    Device("h200", _HOPPER, 0.38, _LLAMA3 + "; the H200 has the H100's compute"),
    Device("l4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}, 0.213,
           "no published training run: the V100's " + _GPT3),
    Device("titanx", {"fp32": 11.0}, 0.213, "no published training run: the V100's " + _GPT3),
)}
CPU_MFU = 0.30  # benchmarks/results/step_efficiency.json: 24-36% of the GEMM rate for the three families
CPU_MFU_SOURCE = "a tiny vlkit step's share of this machine's GEMM rate (benchmarks/step_efficiency.py: 24-36%)"


def gpu_device(name: str) -> str | None:
    """The table's device for a CUDA device name (``NVIDIA H100 80GB HBM3`` -> ``h100``), None when unknown."""
    lowered = name.lower().replace(" ", "")
    return next((key for key in DEVICES if key in lowered), None)


def choose_device(requested: str | None, gpus: int, ran_on: list[str] | None = None) -> str:
    """The one rule for the device a comparison is priced on (the dry run's estimate, a seed's cost, the account):
    ``compare.plan.device`` (``requested``) when set; else this machine's CPU when units take no GPU, else the
    visible GPU when the table knows it, else the A100. ``ran_on``: the CUDA device names the finished units
    recorded (pricing what was spent): units that took no GPU ran on this CPU, and the first recorded GPU the table
    knows comes before ``requested``."""
    if ran_on is not None:
        if not gpus:
            return "cpu"
        requested = next((d for d in map(gpu_device, ran_on) if d), requested)
    if requested:
        return requested
    if not gpus:
        return "cpu"
    import torch

    return gpu_device(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "") or "a100"


def cpu_device(threads: int, precisions: tuple[str, ...] = ("fp32",)) -> Device:
    """This machine on ``threads`` threads: its measured GEMM rate per precision (`vlkit.runtime.gemm_gflops`) as
    the peak, and vlkit's measured step efficiency as the MFU."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dtypes = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        peaks = {p: gemm_gflops(dtype=dtypes[p]) / 1e3 for p in precisions}
    finally:
        torch.set_num_threads(previous)
    return Device("cpu", peaks, CPU_MFU, CPU_MFU_SOURCE)


__all__ = ["CPU_MFU", "DEVICES", "Device", "PRECISIONS", "TRAINER_PRECISION", "choose_device", "cpu_device",
           "gpu_device"]
