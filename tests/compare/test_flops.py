"""Issues 42 and 53: a comparison's costs in FLOPs. Every unit's FLOPs per step, counted on the meta device without
computing, equal torch's counter run on the same model, objective mix or task and batch computed for real
(within 1%), for each family's pre-training and fine-tunings; the dry run prints FLOPs, steps and GPU-hours per
unit without reading any data. The papers' presets are the papers' runs as their official code ran them, each
within 15% of an independent count by hand (benchmarks/paper_flops.py)."""
import importlib.util
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from vlkit.cli import compose, main
from vlkit.compare import Comparison, resolve_config
from vlkit.compare.config import objective_mix, run_data
from vlkit.compare.costs import cost_settings, count_costs, model_sizes, text_positions, unit_shapes
from vlkit.flops.buckets import Spread, official_buckets, stated_buckets
from vlkit.flops.count import flop_counter_mode, on_meta
from vlkit.flops.devices import DEVICES, choose_device
from vlkit.models.base import build_model, split_model_config
from vlkit.objectives.mix import build_pretraining
from vlkit.registry import MODELS, TASKS
from vlkit.tasks import build_task

# the smoke comparison at a batch of 8, its texts and regions at plan shapes of their own
SMOKE = ["compare=smoke", "compare.seeds=[0]", "compare.trainer.common.batch_size=8", "compare.plan.regions=7",
         "compare.plan.text_len=11"]


def real_flops(module, batch, **forward) -> int:
    """torch's counter around one training step computed for real."""
    module.train()
    counter = flop_counter_mode()
    with counter:
        module(batch, **forward).loss.backward()
    return counter.get_total_flops()


@pytest.fixture(scope="module")
def smoke_plan():
    cfg = resolve_config(compose("compare", SMOKE))
    comparison = Comparison(cfg, ".", progress=False)
    return comparison, count_costs(comparison, cost_settings(cfg["compare"]))


def _real_model(comparison, spec):
    data = run_data(comparison.cfg["data"], spec)
    name, preset, overrides = split_model_config(spec.model)
    cls = MODELS.get(name)
    sizes = model_sizes(cls, overrides, data, cls.config_class.from_preset(preset, **overrides))
    torch.manual_seed(0)
    return build_model({**spec.model, **sizes})


@pytest.mark.parametrize("family", ["vilbert", "uniter", "meter"])
def test_a_units_flops_per_step_equal_torchs_counter_on_the_real_step(smoke_plan, family):
    """Pre-training (per objective a step may draw, weighted by the mix's ratios) and every fine-tuning of the
    family (the pre-trained variant's tasks, retrieval built from the pre-training's ITM head)."""
    comparison, plan = smoke_plan
    planned = plan.by_key()
    index = next(i for i, s in enumerate(comparison.specs) if s.family == family)
    spec = comparison.specs[index]
    units = [u for u in comparison.all_units() if u.run == index and (u.is_pretrain or u.variant == "pretrained")]
    assert len(units) >= 4
    for unit in units:
        model = _real_model(comparison, spec)
        pretraining = build_pretraining(model, objective_mix(spec))
        shapes = unit_shapes(comparison, unit, cost_settings(comparison.compare), model)
        if unit.is_pretrain:
            batch = model.example_batch(shapes.batch_size, text_len=shapes.text_len, num_regions=shapes.regions,
                                        padded=False)
            drawn = [u for u in pretraining.units if not u.every_step]
            always = [u for u in pretraining.units if u.every_step]
            if pretraining.sampling == "sum":
                expected = real_flops(pretraining, batch, units=list(pretraining.units))
            else:
                total = sum(u.ratio for u in drawn)
                expected = sum(real_flops(pretraining, batch, units=[u, *always]) * u.ratio / total for u in drawn)
        else:
            cls = TASKS.get(unit.task)
            task_cfg = comparison.task_cfg(unit.task, spec)
            options = {**cls.plan_options(task_cfg), **(task_cfg.get("options") or {})}
            task = build_task(unit.task, pretraining if cls.from_pretraining else model, **options)
            expected = real_flops(task, task.example_batch(shapes.batch_size, shapes.text_len, shapes.regions))
        got = planned[comparison.key(unit)].flops_per_step
        assert expected > 0 and got == pytest.approx(expected, rel=0.01), comparison.key(unit)


def test_the_plan_counts_the_shapes_it_is_given(smoke_plan):
    """More tokens, regions and examples per step cost more; hours are FLOPs / (peak x MFU)."""
    comparison, plan = smoke_plan
    settings = cost_settings({"plan": {"regions": 7, "text_len": 22, "device": "a100", "mfu": 0.5}})
    longer = count_costs(comparison, settings)
    key = "uniter/seed0/pretrain"
    assert longer.by_key()[key].flops_per_step > 1.5 * plan.by_key()[key].flops_per_step
    row = longer.by_key()[key]
    assert row.hours == pytest.approx(row.flops / (DEVICES["a100"].peaks["fp32"] * 1e12 * 0.5) / 3600)
    assert longer.mfu_source == "compare.plan.mfu"


def test_cost_settings_are_checked_naming_the_key():
    for plan, key in (({"device": "tpu"}, "compare.plan.device"), ({"mfu": 1.5}, "compare.plan.mfu"),
                      ({"text_len": {"vqa": 0}}, "compare.plan.text_len.vqa"), ({"regionz": 3}, "regionz"),
                      ({"precision": "int8"}, "compare.plan.precision")):
        with pytest.raises((KeyError, ValueError), match=key):
            cost_settings({"plan": plan})
    with pytest.raises(ValueError, match="no bf16 peak"):
        DEVICES["v100"].peak("bf16")


def test_dry_run_prints_flops_steps_and_gpu_hours_per_unit_without_data(capsys, tmp_path, monkeypatch):
    """The base-size plan on 8 GPUs reads no data (no feature store is extracted in an empty cache) and prints
    every unit's FLOPs per step, steps and GPU-hours, the total and the wall per executor."""
    from vlkit import environment

    monkeypatch.setattr(environment, "shapes_feature_store", lambda *a, **k: pytest.fail("the plan extracted features"))
    start = time.perf_counter()
    assert main(["compare", "compare=base", "dry_run=true", "compare.gpus_per_unit=8", "compare.plan.device=h100",
                 "compare.seeds=[0]", "compare.tasks=[vqa]", f"cache_dir={tmp_path}", "progress=false"]) == 0
    wall = time.perf_counter() - start
    out = capsys.readouterr().out
    assert not any(tmp_path.iterdir())
    rows = [line for line in out.splitlines() if line.startswith("| uniter/seed0/pretrain |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    steps, gflop, gpu_hours = int(cells[2].replace(",", "")), float(cells[3].replace(",", "")), float(cells[5].replace(",", ""))
    assert steps == 100_000 and gflop > 5e3 and gpu_hours > 0.1
    assert math.isclose(gpu_hours, gflop * 1e9 * steps / (989.4e12 * 0.38) / 3600, rel_tol=0.01)
    assert "Device: h100, dense peak bf16 989 TFLOPS; MFU 38.0%" in out and "GPU-hours" in out and "Total: " in out
    for name in ("local", "slurm", "ray"):
        assert f"executor {name}:" in out
    print(f"base plan in {wall:.1f} s")


# -- the papers' runs as they ran (issue 53) --------------------------------------------------------------------
_spec = importlib.util.spec_from_file_location("paper_flops", Path(__file__).resolve().parents[2] / "benchmarks"
                                               / "paper_flops.py")
paper_flops = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paper_flops)


def _paper(preset, *overrides):
    cfg = resolve_config(compose("compare", [f"compare={preset}", *overrides]))
    return Comparison(cfg, ".", progress=False)


@pytest.mark.parametrize("preset", sorted(paper_flops.PAPERS))
def test_a_paper_plan_matches_an_independent_hand_count(preset):
    """The plan's FLOPs per example of each paper preset within 15% of benchmarks/paper_flops.py's count by hand
    (6 x parameters passed x inputs, attention and the heads as the official code computes them)."""
    plan = paper_flops.planned(preset)
    hand = paper_flops.hand_count(preset, plan["text_len"], plan["regions"])
    assert plan["planned_flops_per_example"] == pytest.approx(hand, rel=0.15)


@pytest.mark.parametrize("preset, vocab, regions", [("paper_uniter", 28996, (2048, 1601)),
                                                    ("paper_uniter_alldata", 28996, (2048, 1601)),
                                                    ("paper_vilbert", 30522, (2048, 1601)),
                                                    ("paper_meter", 50265, None)])
def test_paper_presets_build_the_papers_models_and_mixes(preset, vocab, regions):
    """Their own vocabularies and BUTD feature sizes (not the shapes world's), and no objective the official
    configs do not run (no itc)."""
    comparison = _paper(preset)
    spec = comparison.specs[0]
    data = run_data(comparison.cfg["data"], spec)
    name, preset_name, overrides = split_model_config(spec.model)
    cls = MODELS.get(name)
    sizes = model_sizes(cls, overrides, data, cls.config_class.from_preset(preset_name, **overrides))
    model = on_meta(lambda: build_model({**spec.model, **sizes}))
    assert model.get_input_embeddings().num_embeddings == vocab
    if regions:
        assert (model.config.v_feature_size, model.config.v_target_size) == regions
    assert "itc" not in objective_mix(spec)["objectives"]


def test_uniters_official_sampler_fills_well_under_its_budget():
    """The official sampler sizes every batch of a bucket by the bucket's longest example: at the stated lengths
    a step holds 1,300-1,750 examples (8 GPUs x 2 accumulated batches of 10,240 units), 37-53% of the budget."""
    text, regions = Spread(14, 3, 4, 62), Spread(36, 20, 10, 100)
    step = stated_buckets(text, regions, 10240)
    assert 0.37 < step.fill < 0.53 and step.fill <= step.padded_fill < 0.6
    comparison = _paper("paper_uniter")
    shapes = count_costs(comparison, cost_settings(comparison.compare), 8).units[0].shapes
    assert 1300 <= shapes.batch_size <= 1750
    # the same lengths all alike fill the budget: the fill is the sampler's, not the lengths'
    full = official_buckets(np.full(8192 * 4, 14), np.full(8192 * 4, 36), 10240)
    assert full.fill > 0.95


@pytest.mark.parametrize("plan, message", [
    ({"text_len": {"vqaa": 20}}, r"compare.plan.text_len.vqaa: no task 'vqaa' \(did you mean 'vqa'"),
    ({"lengths": {"coco": {"share": 1, "text": [14, 3]}}}, "compare.plan.lengths.coco"),
])
def test_a_misspelt_plan_key_is_refused_naming_it(plan, message):
    with pytest.raises((KeyError, ValueError), match=message):
        cost_settings({"plan": plan})


def test_shapes_the_model_or_data_cannot_hold_are_refused_naming_the_key_and_the_limit():
    """text_len beyond the model's position embeddings (tiny presets: 64) and regions beyond data.image.max_bb."""
    comparison = Comparison(resolve_config(compose("compare", SMOKE)), ".", progress=False)
    with pytest.raises(ValueError, match=r"compare.plan.text_len=100 for run 'vilbert': its model takes at most 64"):
        count_costs(comparison, cost_settings({"plan": {"text_len": 100, "regions": 7}}))
    max_bb = run_data(comparison.cfg["data"], comparison.specs[0])["image"]["max_bb"]
    with pytest.raises(ValueError, match=rf"compare.plan.regions=100000 for run 'vilbert'.*max_bb={max_bb}"):
        count_costs(comparison, cost_settings({"plan": {"text_len": 11, "regions": 100000}}))
    assert text_positions(on_meta(lambda: build_model({"name": "meter", "preset": "clip32-roberta"}))) == 512


def test_one_device_rule_for_the_estimate_the_seed_costs_and_the_account(monkeypatch):
    """compare.plan.device when set; else this CPU without GPUs, the visible GPU the table knows, else the A100;
    pricing what was spent, units without GPUs ran on this CPU and a recorded GPU comes before the setting."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose_device(None, 0) == "cpu" and choose_device("h100", 0) == "h100"
    assert choose_device(None, 8) == "a100" and choose_device("v100", 8) == "v100"
    assert choose_device("h100", 0, ["NVIDIA A100-SXM4-80GB"]) == "cpu"
    assert choose_device("h100", 8, ["", "NVIDIA A100-SXM4-80GB"]) == "a100"
    assert choose_device("h100", 8, ["Some GPU"]) == "h100" and choose_device(None, 8, []) == "a100"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    assert choose_device(None, 8) == "h100"
