"""Issue 43: the from-scratch recipe for tiny models is a trainer preset (``trainer=scratch_tiny``), the one the
default comparison fine-tunes with; issue 52: its pre-training recipe (``trainer=pretrain_tiny_scratch``) is the one
the default comparison pre-trains with."""
import dataclasses

from vlkit.cli import compose
from vlkit.compare import resolve_config
from vlkit.train import TrainerConfig, trainer_config

RECIPE = {"lr": 3.0e-4, "lr_mult_head": 10, "group_by_length": 8}


def test_scratch_tiny_is_the_default_trainer_with_the_recipe():
    cfg = compose("finetune", ["trainer=scratch_tiny", "trainer.max_steps=7"])
    trainer = trainer_config(cfg)
    expected = dataclasses.replace(TrainerConfig(), output_dir="outputs/finetune", max_steps=7, **RECIPE)
    assert trainer == expected
    assert trainer_config(compose("pretrain", ["trainer=scratch_tiny"])).lr == 3.0e-4


def test_the_default_comparison_fine_tunes_with_scratch_tiny():
    """The comparisons built on conf/compare/default.yaml keep the fine-tuning trainer they had (its keys, their
    order and values): their records stay bit-identical."""
    for name in ("default", "claims", "masking"):
        trainer = resolve_config(compose("compare", [f"compare={name}"]))["compare"]["trainer"]
        assert list(trainer) == ["common", "pretrain", "finetune", "tasks"]
        assert trainer["finetune"] == RECIPE and list(trainer["finetune"]) == list(RECIPE)
    smoke = resolve_config(compose("compare", ["compare=smoke"]))["compare"]["trainer"]["finetune"]
    assert smoke == {"lr": 5.0e-4}  # a comparison of its own keeps its own


def test_pretrain_tiny_scratch_is_the_default_trainer_at_the_comparisons_pretraining_rate():
    cfg = compose("pretrain", ["trainer=pretrain_tiny_scratch", "trainer.max_steps=7"])
    expected = dataclasses.replace(TrainerConfig(), output_dir="outputs/pretrain", max_steps=7, lr=2.0e-3)
    assert trainer_config(cfg) == expected
    for name in ("default", "claims", "masking"):  # the records of the comparisons stay bit-identical
        assert resolve_config(compose("compare", [f"compare={name}"]))["compare"]["trainer"]["pretrain"] == {"lr": 2.0e-3}
    assert resolve_config(compose("compare", ["compare=smoke"]))["compare"]["trainer"]["pretrain"] == {"lr": 1.0e-3}
