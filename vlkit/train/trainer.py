"""One Accelerate trainer for pre-training and fine-tuning.

A *training module* is an ``nn.Module`` whose ``forward(batch, step, micro_step)`` returns a
`LossOutput`; its ``model`` attribute is the `VLModel` (its ``encoder_prefixes`` pick the
parameter groups). ``step`` is the optimizer-step index, the same for every micro-batch of an
accumulation group and on every rank; ``micro_step`` the global micro-batch index.

    trainer = Trainer(module, TrainerConfig.from_preset("meter", max_steps=1000, output_dir="run"))
    trainer.fit(trainer.loader(dataset))

Every run writes ``<output_dir>/metrics.jsonl`` (one object per logged step: step, loss, lr, padding,
step_s (the step's wall seconds), ...) and ``<output_dir>/checkpoints/step_<N>/``; ``resume=true``
continues bit-exactly.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader

from vlkit import runtime
from vlkit.config import KeyTypeError, Problem, SpecError, UnknownKeyError, merge_structured, store_configs
from vlkit.models.compile import compile_blocks, set_activation_checkpointing
from vlkit.models.recipe import recipe_of
from vlkit.registry import MODELS
from vlkit.train import checkpoint as ckpt
from vlkit.train.distributed import BATCHING, LoaderConfig, batch_units, build_train_loader, shard_batch
from vlkit.train.logging import JSONLTracker, flatten, progress, read_jsonl, resolve_trackers, truncate_jsonl
from vlkit.train.optim import (ADAMW_IMPLS, ADAMW_RULES, NO_DECAY_RULES, SCHEDULES, build_optimizer, build_scheduler,
                               warmup_steps)
from vlkit.train.resume import ResumeMismatchError, differences
from vlkit.types import LossOutput, VLBatch
from vlkit.validate import describe_inputs, nonfinite_inputs
from vlkit.version import __version__

MIXED_PRECISION = ("no", "bf16", "fp16")
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"


class TrainerConfigError(SpecError):
    """Values a `TrainerConfig` cannot train with; ``problems`` lists each, naming its key (``trainer.<key>``)."""


@dataclass
class TrainerConfig:
    """Mirrored by ``conf/trainer/default.yaml``; each family's official recipe in `trainer_presets`."""

    max_steps: int = 1000
    seed: int = 42
    output_dir: str = "outputs/train"
    # AdamW and parameter groups (towers at lr, rest of the model x lr_mult, heads x lr_mult_head)
    lr: float = 5e-5
    lr_mult: float = 1.0
    lr_mult_head: Optional[float] = None  # None: same as lr_mult
    weight_decay: float = 0.01
    no_decay: str = "bert"  # bert | bert_timm (official name rules) | norms (biases + norm layers)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-8
    adamw_rule: str = "torch"  # torch (torch.optim.AdamW) | hf (the official codes' update, vlkit.train.HFAdamW)
    adamw_impl: str = "fused"  # fused | foreach | loop
    # schedule: linear warm-up, then linear | polynomial (power, down to end_lr) | constant
    warmup: float = 0.1  # fraction of max_steps when < 1, else steps
    schedule: str = "linear"
    power: float = 1.0
    end_lr: float = 0.0
    schedule_offset: int = 0  # 1: the first update already uses the step-1 lr (UNITER, ViLBERT)
    # update
    grad_clip: float = 1.0  # max global grad norm; 0 disables
    grad_accum: int = 1
    mixed_precision: str = "no"  # no | bf16 | fp16
    activation_checkpointing: bool = False  # recompute each transformer block in the backward pass (less memory)
    compile: bool = False  # torch.compile each transformer block (regional compilation)
    cpu: bool = False
    # data (Trainer.loader)
    batching: str = "fixed"  # fixed | units (UNITER's token buckets: tokens + regions/patches)
    batch_size: int = 32
    group_by_length: int = 0  # fixed: sort groups of this many batches by text length (0: off)
    max_units: int = 10240
    bucket_size: int = 8192
    size_multiple: int = 8
    drop_last: bool = True
    num_workers: int = 0
    split_batches: bool = True  # every rank takes its 1/world part of each global batch
    find_unused_parameters: bool = True
    # logging, evaluation, checkpoints
    log_every: int = 1
    eval_every: int = 0  # 0: only at the end
    save_every: int = 1000  # 0: only at the end
    keep_checkpoints: int = 3  # 0 keeps all
    resume: bool = False
    trackers: list[str] = field(default_factory=lambda: ["auto"])  # auto: TensorBoard when installed
    progress: bool = True

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise TrainerConfigError(problems)

    def problems(self) -> list[Problem]:
        """Every value this config cannot train with (NaN, inf, out of range, empty), each naming its key."""
        out = []
        for name, allowed in (("no_decay", NO_DECAY_RULES), ("schedule", SCHEDULES),
                              ("mixed_precision", MIXED_PRECISION), ("batching", BATCHING),
                              ("adamw_rule", ADAMW_RULES), ("adamw_impl", ADAMW_IMPLS)):
            if getattr(self, name) not in allowed:
                out.append(Problem(f"trainer.{name}", f"={getattr(self, name)!r}; choose one of {', '.join(allowed)}"))
        numbers = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if isinstance(getattr(self, f.name), (int, float)) and not isinstance(getattr(self, f.name), bool)}
        numbers.update({f"betas[{k}]": b for k, b in enumerate(self.betas)})
        bad = {name for name, value in numbers.items() if not math.isfinite(value)}
        out += [Problem(f"trainer.{name}", f"={numbers[name]} is not a finite number") for name in sorted(bad)]
        for name in ("max_steps", "grad_accum", "log_every", "batch_size", "max_units", "bucket_size", "size_multiple"):
            if name not in bad and getattr(self, name) < 1:
                out.append(Problem(f"trainer.{name}", f" must be >= 1, got {getattr(self, name)}"))
        for name in ("eval_every", "save_every", "keep_checkpoints", "grad_clip", "num_workers", "lr", "eps",
                     "group_by_length", "weight_decay", "warmup", "power", "end_lr", "lr_mult", "schedule_offset"):
            if name not in bad and getattr(self, name) < 0:
                out.append(Problem(f"trainer.{name}", f" must be >= 0, got {getattr(self, name)}"))
        if self.lr_mult_head is not None and "lr_mult_head" not in bad and self.lr_mult_head < 0:
            out.append(Problem("trainer.lr_mult_head", f" must be >= 0, got {self.lr_mult_head}"))
        if len(self.betas) != 2:
            out.append(Problem("trainer.betas", f" needs two values, got {list(self.betas)}"))
        elif not all(0 <= b < 1 for b in self.betas):
            out.append(Problem("trainer.betas", f"={list(self.betas)}: each must be in [0, 1)"))
        if not str(self.output_dir).strip():
            out.append(Problem("trainer.output_dir", " is empty: name the folder the run writes to"))
        if not {"max_steps", "warmup"} & bad and self.max_steps >= 1 and self.warmup >= 0:
            try:
                warm = warmup_steps(self.warmup, self.max_steps)
            except ValueError as err:
                return out + [Problem("trainer.warmup", f": {err}")]
            if self.schedule != "constant" and warm >= self.max_steps:
                out.append(Problem("trainer.warmup", f"={self.warmup} gives {warm} warm-up steps, not fewer than "
                                                     f"trainer.max_steps={self.max_steps}"))
        return out

    @classmethod
    def from_preset(cls, preset: str, **overrides: Any) -> "TrainerConfig":
        """A family's official recipe (its `vlkit.models.recipe.Recipe` ``trainer_preset``) with ``overrides``."""
        presets = trainer_presets()
        if preset not in presets:
            raise KeyError(f"unknown trainer preset {preset!r}; presets: {', '.join(presets)}")
        return cls.from_cfg({**presets[preset], **overrides})

    @classmethod
    def from_cfg(cls, cfg: Any = None, **overrides: Any) -> "TrainerConfig":
        """From a `TrainerConfig`, a mapping or a ``DictConfig`` (unknown keys are an error)."""
        try:
            return merge_structured(cls, cfg if cfg is not None else {}, overrides)
        except UnknownKeyError as err:  # named as the command line names it: trainer.<key>
            raise TrainerConfigError([Problem(f"trainer.{err.key}", f" is not a trainer setting{_close(str(err.key))}")]) from None
        except KeyTypeError as err:
            types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
            wanted = _KINDS.get(types.get(str(err.key).split(".")[0], ""), "a value of the documented type")
            raise TrainerConfigError([Problem(f"trainer.{err.key}", f"={err.value!r}: give {wanted}")]) from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _close(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, [f.name for f in dataclasses.fields(TrainerConfig)], n=1, cutoff=0.75)
    return f" (did you mean trainer.{close[0]}?)" if close else ""


# how messages name the type of a `TrainerConfig` field (its annotation, a string under postponed annotations)
_KINDS = {"int": "a whole number", "float": "a number", "Optional[float]": "a number or null", "bool": "true or false",
          "str": "a string", "list[float]": "a list of numbers", "list[str]": "a list of strings"}


def trainer_presets() -> dict[str, dict[str, Any]]:
    """Each registered family's official pre-training recipe (its `vlkit.models.recipe.Recipe` ``trainer_preset``);
    batch and accumulation depend on the hardware."""
    presets = {name: recipe_of(MODELS.get(name)).trainer_preset for name in MODELS.names()}
    return {name: dict(preset) for name, preset in presets.items() if preset}


def register_hydra_configs() -> None:
    """Store each family's recipe in Hydra's ConfigStore as ``trainer/<family>`` (``trainer=meter``)."""
    store_configs("trainer", {name: TrainerConfig.from_preset(name) for name in trainer_presets()})


def trainer_config(cfg: Any) -> TrainerConfig:
    """The `TrainerConfig` of a composed command config: ``cfg.trainer`` plus the top-level ``resume``."""
    trainer = cfg["trainer"]
    resume = cfg.get("resume")
    return TrainerConfig.from_cfg(trainer, **({} if resume is None else {"resume": bool(resume)}))


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; training stopped before the optimizer step."""


@dataclass
class TrainResult:
    step: int
    history: list[dict[str, Any]]  # this run's per-step records (what metrics.jsonl gets when logged)
    eval: dict[str, float]  # the last evaluation
    checkpoint: Optional[Path]


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Run a block (evaluation) without moving the training RNG streams."""
    state = ckpt.rng_state()
    try:
        yield
    finally:
        ckpt.set_rng_state(state)


def _set_epoch(data: Any, epoch: int) -> None:
    for obj in (data, getattr(data, "batch_sampler", None), getattr(data, "sampler", None)):
        if hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)


def _stream(data: Any) -> Any:
    """The seekable stream (`vlkit.data.stream.StreamedPairs`) behind a loader, or None."""
    dataset = getattr(data, "dataset", None)
    return dataset if hasattr(dataset, "seek") and hasattr(dataset, "state") else None


class _BatchStream:
    """Endless batches over epochs with the data position (epoch, batches consumed in it)."""

    def __init__(self, data: Iterable[VLBatch], epoch: int = 0, consumed: int = 0):
        self.data, self.epoch, self.consumed = data, epoch, consumed
        self._iter = self._open(consumed)

    def _open(self, skip: int) -> Iterator[VLBatch]:
        _set_epoch(self.data, self.epoch)
        stream = _stream(self.data)
        if stream is not None:  # a stream seeks to its position without reading what it skips
            stream.set_epoch(self.epoch)
            stream.seek(skip)
            return iter(self.data)
        if skip and isinstance(self.data, DataLoader):
            from accelerate import skip_first_batches

            return iter(skip_first_batches(self.data, skip))
        return itertools.islice(iter(self.data), skip, None)

    def next(self) -> VLBatch:
        batch = next(self._iter, None)
        if batch is None:
            if self.consumed == 0:
                raise ValueError(f"the training data yielded no batches in epoch {self.epoch}")
            self.epoch, self.consumed = self.epoch + 1, 0
            self._iter = self._open(0)
            batch = next(self._iter, None)
            if batch is None:
                raise ValueError(f"the training data yielded no batches in epoch {self.epoch}")
        if not isinstance(batch, VLBatch):
            raise TypeError(f"the training data must yield VLBatch, got {type(batch).__name__} "
                            f"(epoch {self.epoch}, batch {self.consumed})")
        self.consumed += 1
        return batch


class Trainer:
    """Drives a training module with Accelerate (see the module docstring)."""

    def __init__(self, module: nn.Module, config: TrainerConfig | Mapping[str, Any] | Any,
                 eval_fn: Callable[[nn.Module], Mapping[str, float]] | None = None,
                 run: Mapping[str, Any] | None = None):
        """``run``: what the checkpoints record of the run besides the trainer config (`vlkit.train.resume.run_record`),
        compared on resume."""
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs

        self.cfg = config if isinstance(config, TrainerConfig) else TrainerConfig.from_cfg(config)
        self.module, self.eval_fn, self.run = module, eval_fn, dict(run or {})
        self.output_dir = Path(self.cfg.output_dir)
        self.checkpoint_dir = self.output_dir / CHECKPOINTS
        self.metrics_path = self.output_dir / METRICS_FILE
        self.accelerator = Accelerator(
            mixed_precision=self.cfg.mixed_precision, cpu=self.cfg.cpu, project_dir=str(self.output_dir),
            log_with=[JSONLTracker(self.metrics_path), *resolve_trackers(self.cfg.trackers)],
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=self.cfg.find_unused_parameters)])
        if self.cfg.mixed_precision != "no" and not self.accelerator.native_amp:
            self.log.warning("trainer.mixed_precision=%s is not available on %s: training in fp32",
                             self.cfg.mixed_precision, self.accelerator.device)
        elif self.cfg.mixed_precision == "bf16" and self.accelerator.device.type == "cpu" and not runtime.native_cpu_bf16():
            self.log.warning("trainer.mixed_precision=bf16 on a CPU without native bf16 (AVX-512-BF16 or AMX): torch's "
                             "bf16 matmul runs a reference kernel here, tens of times slower than fp32; set "
                             "trainer.mixed_precision=no")
        model = getattr(module, "model", module)
        self._patch_size = getattr(model, "patch_size", None)
        self._model: nn.Module | None = None
        self._params: list[nn.Parameter] = []  # the prepared model's, during fit

    @property
    def log(self):
        """A logger that writes on the main process only."""
        from accelerate.logging import get_logger

        return get_logger("vlkit.train")

    @property
    def rank(self) -> int:
        return self.accelerator.process_index

    @property
    def world_size(self) -> int:
        return self.accelerator.num_processes

    def loader(self, dataset: Any, collate_fn: Callable | None = None, lengths: Any = None) -> DataLoader:
        """The training loader of ``dataset`` as the config says (batching, split or sharded)."""
        c = self.cfg
        unit = c.batch_size if c.batching == "fixed" else c.size_multiple
        if c.split_batches and unit % self.world_size:
            key = "batch_size" if c.batching == "fixed" else "size_multiple"
            raise ValueError(f"trainer.{key}={unit} cannot be split equally across {self.world_size} processes; "
                             "make it a multiple of the number of processes or set trainer.split_batches=false")
        replicas, rank = (1, 0) if c.split_batches else (self.world_size, self.rank)
        return build_train_loader(dataset, LoaderConfig.of(c), collate_fn, lengths, replicas, rank)

    # -- the loop ------------------------------------------------------------------------------
    def fit(self, data: Iterable[VLBatch]) -> TrainResult:
        """Train to ``max_steps`` on ``data`` (re-iterated every epoch; a DataLoader's sampler gets
        ``set_epoch``), resuming from the newest checkpoint when ``resume`` is set. Exact resume needs
        a data order fixed by the seed and epoch, as the samplers of `loader` give.

        Afterwards the trainer and its accelerator hold no prepared (DDP-wrapped) model: a wrapper's reducer
        keeps the process group alive, and a gloo group destroyed only at interpreter exit aborts the process
        now and then ("terminate called without an active exception"); `distributed.shutdown` can then end it."""
        try:
            return self._fit(data)
        finally:
            self._release()

    def _release(self) -> None:
        import gc

        self._model, self._params = None, []
        self.accelerator.free_memory()  # its lists of prepared models, optimizers and loaders
        gc.collect()  # the DDP wrapper sits in reference cycles (its hooks): free it now, not at exit

    def _fit(self, data: Iterable[VLBatch]) -> TrainResult:
        from accelerate.utils import set_seed

        cfg, acc = self.cfg, self.accelerator
        self._check_output_dir()
        set_seed(cfg.seed, device_specific=True)
        optimizer = build_optimizer(self.module, cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay, cfg.lr_mult,
                                    cfg.lr_mult_head, cfg.no_decay, cfg.adamw_rule, cfg.adamw_impl)
        scheduler = build_scheduler(optimizer, cfg.max_steps, cfg.warmup, cfg.schedule, cfg.power, cfg.end_lr,
                                    cfg.schedule_offset)
        if cfg.activation_checkpointing:
            set_activation_checkpointing(self.module)
        if cfg.compile:
            compile_blocks(self.module)
        model, optimizer = acc.prepare(self.module, optimizer)
        self._model = model
        step, epoch, consumed, restored = 0, 0, 0, None
        path = ckpt.latest_checkpoint(self.checkpoint_dir) if cfg.resume else None
        if path is not None:
            self._check_resumed_config(path)
            restored = ckpt.load_checkpoint(path, acc.unwrap_model(model), optimizer, scheduler, acc.scaler)
            step, epoch, consumed = restored["step"], restored["epoch"], restored["batches_in_epoch"]
            self.log.info("resuming from %s (step %d, epoch %d, batch %d)", path, step, epoch, consumed)
        elif cfg.resume:
            self.log.info("resume: no checkpoint under %s, starting from step 0", self.checkpoint_dir)
        if acc.is_main_process:
            truncate_jsonl(self.metrics_path, step)
        acc.wait_for_everyone()
        acc.init_trackers("tensorboard", config=flatten(cfg.to_dict()))
        source = _stream(data)
        if restored is not None and source is not None and "stream" in restored:
            source.check_state(restored["stream"], getattr(data, "num_workers", 0), where=str(path))
        if restored is not None and "loader" in restored and hasattr(data, "load_state_dict"):
            data.load_state_dict(restored["loader"], replayed=consumed)  # e.g. the ids a RecordingLoader saw
        stream = _BatchStream(data, epoch, consumed)
        if restored is not None:  # after opening the data, which may draw from the global RNG
            self._restore_rng(restored, path)
        history: list[dict[str, Any]] = []
        last_eval: dict[str, float] = {}
        saved = path if restored is not None else None
        bar = progress(desc="train", total=cfg.max_steps, initial=step, enabled=cfg.progress)
        model.train()  # once: an evaluation restores the mode it found
        self._params = list(model.parameters())  # clipped every step: listed once (a module walk costs ms a step)
        try:
            while step < cfg.max_steps:
                record = self._train_step(model, optimizer, scheduler, stream, step)
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}")
                done = step == cfg.max_steps
                evaluate = self.eval_fn is not None and (done or (cfg.eval_every and step % cfg.eval_every == 0))
                if evaluate:
                    last_eval = self.evaluate()
                    record.update({f"eval/{k}": v for k, v in last_eval.items()})
                history.append(record)
                if done or evaluate or step % cfg.log_every == 0:
                    acc.log({k: v for k, v in record.items() if k != "step"}, step=step)
                if done or (cfg.save_every and step % cfg.save_every == 0):
                    saved = self._save(model, optimizer, scheduler, stream, step)
        finally:
            bar.close()
            for tracker in acc.trackers:
                tracker.finish()
            acc.trackers.clear()
        return TrainResult(step=step, history=history, eval=last_eval, checkpoint=saved)

    def _train_step(self, model: nn.Module, optimizer: Any, scheduler: Any, stream: _BatchStream,
                    step: int) -> dict[str, Any]:
        """One optimizer step over ``grad_accum`` micro-batches; returns the step's record."""
        from accelerate.utils import gather_object

        cfg, acc = self.cfg, self.accelerator
        start = time.perf_counter()
        losses: list[float] = []
        metrics: dict[str, list[float]] = {}
        counts = {"examples": 0, "real": 0, "padded": 0}
        bad = None
        for k in range(cfg.grad_accum):
            batch = stream.next()
            if cfg.split_batches:
                batch = shard_batch(batch, self.rank, self.world_size)
            batch = batch.to(acc.device)
            real, padded = batch_units(batch, self._patch_size)
            counts["examples"] += batch.batch_size
            counts["real"] += real
            counts["padded"] += padded
            sync = contextlib.nullcontext() if k == cfg.grad_accum - 1 else acc.no_sync(model)
            with sync:
                with acc.autocast():
                    out = model(batch, step=step, micro_step=step * cfg.grad_accum + k)
                if not isinstance(out, LossOutput):
                    raise TypeError(f"the training module must return LossOutput, got {type(out).__name__}")
                acc.backward(out.loss / cfg.grad_accum)
            value = float(out.loss.detach().float())
            if bad is None and not math.isfinite(value):
                bad = _nonfinite_record(k, value, batch, out)
            losses.append(value)
            for name, v in out.detached_metrics().items():
                metrics.setdefault(name, []).append(v)
        local = {"loss": sum(losses) / len(losses), "metrics": {n: sum(v) / len(v) for n, v in metrics.items()},
                 "bad": bad, **counts}
        ranks = gather_object([local])
        self._check_finite(ranks, step + 1)
        record: dict[str, Any] = {"step": step + 1, "loss": sum(r["loss"] for r in ranks) / len(ranks)}
        for name in sorted({n for r in ranks for n in r["metrics"]}):
            values = [r["metrics"][name] for r in ranks if name in r["metrics"]]
            record[name] = sum(values) / len(values)
        record["lr"] = cfg.lr * scheduler.lr_lambdas[0](scheduler.last_epoch)  # the lr of this update
        if cfg.grad_clip > 0:
            record["grad_norm"] = float(acc.clip_grad_norm_(self._params, cfg.grad_clip))
            if acc.scaler is None and not math.isfinite(record["grad_norm"]):
                raise NonFiniteLossError(f"step {step + 1}: the gradient norm is {record['grad_norm']} (loss "
                                         f"{record['loss']}); stopped before the optimizer step")
        optimizer.step()
        if not optimizer.step_was_skipped:  # fp16 overflow: the scaler skipped the update
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        padded = sum(r["padded"] for r in ranks)
        record.update(epoch=stream.epoch, examples=sum(r["examples"] for r in ranks), units=padded,
                      padding=1.0 - sum(r["real"] for r in ranks) / padded if padded else 0.0,
                      step_s=time.perf_counter() - start)  # this process's wall seconds: data, passes, update
        return record

    def _check_finite(self, ranks: list[dict[str, Any]], step: int) -> None:
        for rank, r in enumerate(ranks):
            if r["bad"] is not None:
                raise NonFiniteLossError(_nonfinite_message(r["bad"], rank, step,
                                                            ckpt.latest_checkpoint(self.checkpoint_dir)))

    def _restore_rng(self, restored: Mapping[str, Any], path: Path) -> None:
        states = restored["rng"]
        if self.rank < len(states):
            ckpt.set_rng_state(states[self.rank])
        else:
            self.log.warning("%s holds RNG states for %d processes, this run has %d: rank %d keeps its fresh seed",
                             path, len(states), self.world_size, self.rank)
        if restored.get("world_size", self.world_size) != self.world_size and not self.cfg.split_batches:
            self.log.warning("%s was written by %d processes, this run has %d: the sharded data order changes",
                             path, restored["world_size"], self.world_size)

    def _save(self, model: nn.Module, optimizer: Any, scheduler: Any, stream: _BatchStream, step: int) -> Path:
        from accelerate.utils import gather_object

        acc = self.accelerator
        rngs = gather_object([ckpt.rng_state()])
        path = self.checkpoint_dir / f"step_{step}"
        if acc.is_main_process:
            state = {"epoch": stream.epoch, "batches_in_epoch": stream.consumed, "world_size": self.world_size,
                     "config": self.cfg.to_dict(), "run": self.run, "vlkit_version": __version__}
            source = _stream(stream.data)
            if source is not None:  # the stream's position and layout
                state["stream"] = source.state(stream.consumed, getattr(stream.data, "num_workers", 0))
            if hasattr(stream.data, "state_dict"):  # what a wrapping loader keeps across a resume
                state["loader"] = stream.data.state_dict()
            path = ckpt.save_checkpoint(self.checkpoint_dir, step, acc.unwrap_model(model), optimizer, scheduler,
                                        rngs, state, acc.scaler, self.cfg.keep_checkpoints)
        acc.wait_for_everyone()
        return path

    def _check_resumed_config(self, path: Path) -> None:
        """`ResumeMismatchError` when this run's config differs from the checkpoint's outside the safe keys."""
        problems = differences(ckpt.read_state(path, verify=False), {"config": self.cfg.to_dict(), "run": self.run})
        if problems:
            raise ResumeMismatchError(path, problems)

    def _check_output_dir(self) -> None:
        """Refuse to overwrite a previous run unless resuming; drop half-written checkpoints."""
        acc = self.accelerator
        if not self.cfg.resume:
            previous = previous_run(self.output_dir)
            if previous is not None:
                raise FileExistsError(f"{self.output_dir} already holds a run ({previous}); pass resume=true to "
                                      "continue it or choose another trainer.output_dir")
        acc.wait_for_everyone()
        if acc.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            ckpt.remove_stale_temporaries(self.checkpoint_dir)
        acc.wait_for_everyone()

    # -- evaluation --------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """``eval_fn(module)`` in eval mode without gradients, leaving the training RNG untouched."""
        if self.eval_fn is None:
            raise ValueError("this Trainer has no eval_fn")
        module = self.accelerator.unwrap_model(self._model) if self._model is not None else self.module
        was_training = module.training
        module.eval()
        try:
            with preserved_rng(), torch.no_grad(), self.accelerator.autocast():
                out = self.eval_fn(module)
        finally:
            module.train(was_training)
        return {k: float(v) for k, v in out.items()}


def _nonfinite_record(micro_batch: int, value: float, batch: VLBatch, out: LossOutput) -> dict[str, Any]:
    """What a NaN / inf loss came from: the examples, their images, the objectives and any bad inputs."""
    metrics = out.detached_metrics()
    active = sorted(k.split("/", 1)[1] for k in metrics if k.startswith("objective/"))
    culprits = sorted(k.rsplit("/", 1)[0] for k, v in metrics.items() if k.endswith("/loss") and not math.isfinite(v))
    return {"micro_batch": micro_batch, "value": value, "ids": (batch.ids or [])[:8],
            "image_ids": (batch.image_ids or [])[:8], "objectives": culprits or active,
            "inputs": nonfinite_inputs(batch)[:8]}


def _nonfinite_message(bad: Mapping[str, Any], rank: int, step: int, checkpoint: Path | None) -> str:
    where = f"step {step}: the loss is {bad['value']}"
    if bad.get("objectives"):
        where += f" (objective {', '.join(bad['objectives'])})"
    where += f" on rank {rank}, micro-batch {bad['micro_batch']} (examples {bad['ids']}"
    where += f", images {bad['image_ids']})" if bad.get("image_ids") else ")"
    where += "; stopped before the optimizer step."
    if bad.get("inputs"):
        return (f"{where} The inputs hold NaN or inf: {describe_inputs(bad['inputs'])}. Fix or remove that data; "
                "the optimisation is not at fault")
    last = (f"the last checkpoint, {checkpoint}, holds the weights before the failure" if checkpoint is not None
            else "no checkpoint was written before the failure")
    return (f"{where} The inputs are finite, so training diverged: start again in a new trainer.output_dir with a "
            f"lower trainer.lr, trainer.grad_clip > 0 or bf16 instead of fp16 (resume=true continues only with the "
            f"checkpoint's learning rate and settings); {last}")


def previous_run(output_dir: str | Path) -> Path | None:
    """The first checkpoint of a run in ``output_dir``, which a new run without ``resume`` must not overwrite;
    None when there is none: a run that failed before its first checkpoint leaves only a ``metrics.jsonl``,
    which a rerun starts again from step 0 (`truncate_jsonl`)."""
    saved = ckpt.list_checkpoints(Path(output_dir) / CHECKPOINTS)
    return saved[0][1] if saved else None


def read_metrics(output_dir: str | Path) -> list[dict[str, Any]]:
    """The records of ``<output_dir>/metrics.jsonl``."""
    return read_jsonl(Path(output_dir) / METRICS_FILE)


__all__ = ["TrainerConfig", "TrainerConfigError", "trainer_presets", "Trainer", "TrainResult", "NonFiniteLossError",
           "preserved_rng", "register_hydra_configs", "trainer_config", "read_metrics"]
