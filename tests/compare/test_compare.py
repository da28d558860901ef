"""Issue 6: the smoke comparison writes its table, CSV / JSON, manifest and plots, uses identical
data for every family, and a rerun from its manifest reproduces the numbers."""
import csv
import json
import statistics

import pytest
import torch

import vlkit.runtime
from vlkit.cli import main

from compare_helpers import records as _records, untimed as _untimed


def test_outputs_are_complete(smoke):
    out = smoke / "first"
    for name in ("results.md", "results.csv", "results.json", "manifest.json", "metrics.png", "loss_curves.png",
                 "wra_plan.png"):
        assert (out / name).stat().st_size > 0, name
    records = _records(out)
    assert len(records) == 3 * 2 * 2  # families x (pre-trained, scratch) x seeds
    for r in records:
        assert {"family", "preset", "objectives", "seed", "vqa", "ir_r1", "tr_r1", "nlvr2", "params", "wall_s"} <= set(r)
        assert 0.0 <= r["vqa"] <= 1.0
        assert r["ir_r1_chance"] == pytest.approx(1 / 12)  # 12 held-out images, sized apart from the training world
    pretrained = [r for r in records if r["variant"] == "pretrained"]
    assert all(0.0 <= r["itm_acc"] <= 1.0 and r["objectives"].endswith("+itc") for r in pretrained)
    assert {r["family"] for r in records if "refexp" in r} == {"vilbert", "uniter"}  # METER: no region head
    assert all("zs_ir_r1" in r for r in records if r["variant"] == "pretrained")
    for r in records:  # where the time went: each fine-tuning, and the evaluation after pre-training
        stages = [r[f"{task}_wall_s"] for task in ("vqa", "retrieval", "nlvr2")]
        stages += [r["pretrain_wall_s"], r["pretrain_eval_wall_s"]] if r["variant"] == "pretrained" else []
        assert all(s > 0 for s in stages) and sum(stages) <= r["wall_s"] + 1e-6
    with open(out / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == len(records)
    table = (out / "results.md").read_text()
    assert "| run | variant | itm_acc | vqa" in table and "| meter | scratch |" in table
    assert "## Pre-training vs scratch" in table and "## Contestants against each other" in table
    assert json.loads((out / "results.json").read_text())["chance"]["itm_acc"] == 0.5
    manifest = json.loads((out / "manifest.json").read_text())
    assert {"config", "seeds", "data", "ids_seen", "feature_store", "packages", "git_commit"} <= set(manifest)
    assert manifest["feature_store"]["sha256"] and manifest["packages"]["torch"]
    # the machine speed each unit measured after it ran, summarised beside the wall time
    rates = sorted(json.loads(p.read_text())["result"]["machine"]["gemm_gflops"] for p in out.glob("runs/*/*/*/unit.json"))
    assert f"{len(rates)} units: {len(rates)} finished." in (out / "units.md").read_text() and rates[0] > 0
    assert manifest["machine"]["units"] == len(rates)
    assert manifest["machine"]["gemm_gflops"] == {"median": statistics.median(rates), "min": rates[0], "max": rates[-1]}
    assert manifest["machine"]["threads"] == [1]
    # the float kernels the units computed with, and the machine's processor and torch build in the manifest
    kernels = vlkit.runtime.kernels()
    assert manifest["machine"]["kernels"] == [kernels] and f"Kernels: {kernels}." in table
    assert torch.backends.cpu.get_cpu_capability() in kernels and torch.__version__ in kernels
    assert manifest["platform"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert "PyTorch built with" in manifest["platform"]["torch_build"] and manifest["platform"]["processor"]
    assert f"median {statistics.median(rates):.0f} GFLOPS, {rates[0]:.0f}-{rates[-1]:.0f} over {len(rates)} units" in table


def test_every_family_sees_the_same_examples_in_the_same_order(smoke):
    ids = json.loads((smoke / "first" / "manifest.json").read_text())["ids_seen"]
    for seed in (0, 1):
        pretrain = {ids["pretrain"][f"{family}/seed{seed}"] for family in ("vilbert", "uniter", "meter")}
        assert len(pretrain) == 1
        for task in ("vqa", "retrieval", "nlvr2"):
            seen = {v for k, v in ids["finetune"].items() if k.endswith(f"seed{seed}/pretrained-{task}")
                    or k.endswith(f"seed{seed}/scratch-{task}")}
            assert len(seen) == 1, (task, seed)
    assert ids["pretrain"]["uniter/seed0"] != ids["pretrain"]["uniter/seed1"]


def test_rerun_from_manifest_reproduces_the_numbers(smoke):
    first, rerun = _records(smoke / "first"), _records(smoke / "rerun")
    assert [_untimed(r) for r in first] == [_untimed(r) for r in rerun]
    a = json.loads((smoke / "first" / "manifest.json").read_text())
    b = json.loads((smoke / "rerun" / "manifest.json").read_text())
    assert a["data"]["hash"] == b["data"]["hash"] and a["ids_seen"] == b["ids_seen"]


def test_output_dir_is_never_overwritten(smoke):
    with pytest.raises(FileExistsError, match="not empty"):
        main(["compare", "compare=smoke", f"output_dir={smoke / 'first'}"])


@pytest.mark.parametrize("preset", ["default", "smoke", "masking", "objectives", "fusion", "mim", "claims"])
def test_every_shipped_comparison_builds_its_runs(preset):
    """Each run of each shipped comparison composes, loads its objective mix and builds its model and
    pre-training module (a typo in a preset fails here, not an hour into a comparison)."""
    import vlkit
    from vlkit.cli import compose
    from vlkit.compare import objective_mix, resolve_config, run_specs
    from vlkit.compare.claims import check_claims

    cfg = resolve_config(compose("compare", [f"compare={preset}"]))
    specs = run_specs(cfg["compare"])
    assert specs and len({s.name for s in specs}) == len(specs)
    check_claims(cfg["compare"].get("claims") or [], [s.name for s in specs])
    for spec in specs:
        model = vlkit.build_model(dict(spec.model))
        mix = objective_mix(spec)
        if mix is not None:
            pre = vlkit.build_pretraining(model, mix)
            assert set(pre.objectives) >= set(mix["objectives"]) - {"wra"}
