"""The Accelerate trainer: parameter groups, schedules, checkpoints, resume, logging.

transformers (for the schedules) loads only when a scheduler is built.
"""
from vlkit.train.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints, load_checkpoint
from vlkit.train.distributed import LoaderConfig, batch_units, build_train_loader, shard_batch
from vlkit.train.logging import progress, read_jsonl
from vlkit.train.optim import NO_DECAY, HFAdamW, build_optimizer, build_scheduler, param_groups, warmup_steps
from vlkit.train.trainer import (NonFiniteLossError, Trainer, TrainerConfig, TrainResult, preserved_rng, read_metrics,
                                 register_hydra_configs, trainer_config, trainer_presets)

__all__ = [
    "CheckpointError", "latest_checkpoint", "list_checkpoints", "load_checkpoint",
    "LoaderConfig", "batch_units", "build_train_loader", "shard_batch", "progress", "read_jsonl",
    "NO_DECAY", "HFAdamW", "build_optimizer", "build_scheduler", "param_groups", "warmup_steps",
    "trainer_presets", "NonFiniteLossError", "Trainer", "TrainerConfig", "TrainResult", "preserved_rng",
    "read_metrics", "register_hydra_configs", "trainer_config",
]
