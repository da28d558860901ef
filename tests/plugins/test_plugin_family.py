"""Issue 12: a fourth family from an outside package, written against the public API only and found
through the ``vlkit.plugins`` entry point, builds, pre-trains with its own mix, runs every task
(refexp refused cleanly: it takes pixels) and enters a comparison next to UNITER in spawned workers."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

import vlkit
from vlkit.cli import main
from vlkit.testing import FamilyContract
from vlkit.train import TrainerConfig

PACKAGE = Path(__file__).resolve().parent / "vlkit_vilt"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


@pytest.fixture(scope="module", autouse=True)  # the contract class below needs it too
def plugin(install_plugin):
    """The package pip-installed into a temporary target (found through its entry point), then removed."""
    return install_plugin("vlkit_vilt", "vlkit_vilt", "vilt")


class TestViltContract(FamilyContract): family = "vilt"  # noqa: E701 (vlkit.testing's suite, one line)


def test_the_family_joins_every_registry(plugin, tmp_path):
    assert "vilt" in vlkit.list_models() and "vilt/tiny" in vlkit.list_models(presets=True)
    assert sys.modules["vlkit_vilt"].__file__.startswith(str(plugin))  # the installed copy, not the source
    model = vlkit.build_model("vilt", preset="tiny").eval()
    batch = model.example_batch(batch_size=3)
    out = model(batch)
    assert out.joint.shape == (3, 64) and out.region_states.shape == (3, 16, 64)  # 32 px / 8 px patches
    torch.testing.assert_close(model(batch, pooled_only=True).joint, out.joint, atol=1e-5, rtol=0)
    model.save_pretrained(tmp_path / "m")
    torch.testing.assert_close(vlkit.from_pretrained(tmp_path / "m").eval()(batch).joint, out.joint)
    pre = vlkit.build_pretraining(model)  # the family's own mix: MLM + ITM
    assert set(pre.objectives) == {"mlm", "itm"} and pre.objectives["itm"].split == "half"
    assert TrainerConfig.from_preset("vilt").lr == 1e-4  # trainer=vilt
    vqa = vlkit.build_task("vqa", model, num_answers=4)
    assert vqa.head_name == "vqa_classifier" and "vqa_classifier.3.weight" in vqa.state_dict()  # its own head
    nlvr2 = vlkit.build_task("nlvr2", vlkit.build_model("vilt", preset="tiny"))
    assert nlvr2.head_name == "nlvr2_head" and nlvr2.model.token_type_embeddings.num_embeddings == 3  # generic head
    with pytest.raises(vlkit.IncompatibleTask, match="vilt takes pixels"):
        vlkit.build_task("refexp", model)


def test_pretrain_then_every_task_through_the_commands(command_args, plugin, cache, tmp_path):
    pre = tmp_path / "pre"
    assert main(["pretrain", "model=vilt", *command_args(cache, pre)]) == 0
    run = json.loads((pre / "run.json").read_text())
    assert run["family"] == "vilt" and set(run["objectives"]["objectives"]) == {"mlm", "itm"}
    for task in ("vqa", "retrieval", "nlvr2", "snli_ve"):
        ft = tmp_path / task
        assert main(["finetune", f"task={task}", "model=vilt", f"init={pre}", *command_args(cache, ft)]) == 0
        metrics = json.loads((ft / "run.json").read_text())["metrics"]
        assert metrics and all(0.0 <= v <= 1.0 for k, v in metrics.items() if not k.endswith("/n")), (task, metrics)
        assert main(["evaluate", f"checkpoint={ft}", f"cache_dir={cache}"]) == 0
        assert json.loads((ft / "eval.json").read_text()) == metrics
    with pytest.raises(vlkit.IncompatibleTask, match="takes pixels"):
        main(["finetune", "task=refexp", "model=vilt", f"init={pre}", *command_args(cache, tmp_path / "refexp")])
    zero_shot = tmp_path / "zs.json"
    assert main(["evaluate", f"checkpoint={pre}", "task=retrieval", f"cache_dir={cache}", f"output={zero_shot}"]) == 0
    assert "val/ir_r1" in json.loads(zero_shot.read_text())


COMPARISON = """# @package _global_
defaults:
  - smoke
  - _self_
compare:
  title: a plugin family next to UNITER
  seeds: [0]
  baseline: false
  tasks: [vqa, retrieval, refexp, nlvr2, snli_ve]
  runs:
    - {name: uniter, model: {name: uniter, preset: tiny}, objectives: uniter}
    - name: vilt
      model: {name: vilt, preset: tiny}
      objectives: {sampling: sum, objectives: {mlm: {weight: 1.0}, itm: {weight: 1.0, split: half}}}
      task_overrides: {retrieval: {options: {num_negatives: 2}}}
"""


def test_smoke_comparison_next_to_uniter_in_spawned_workers(plugin, cache, tmp_path):
    path = tmp_path / "plugin_comparison.yaml"
    path.write_text(COMPARISON)
    out = tmp_path / "out"
    assert main(["compare", f"compare={path}", f"output_dir={out}", "workers=2", "threads=1", "progress=false",
                 f"cache_dir={cache}"]) == 0
    records = {r["run"]: r for r in json.loads((out / "results.json").read_text())["records"]}
    assert {r["family"] for r in records.values()} == {"uniter", "vilt"}
    for record in records.values():
        assert {"vqa", "ir_r1", "tr_r1", "zs_ir_r1", "nlvr2", "snli_ve"} <= set(record)
    assert "refexp" in records["uniter"] and "refexp" not in records["vilt"]  # skipped for the pixel family
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["compare"]["runs"][1]["task_overrides"]["retrieval"]["options"]["num_negatives"] == 2
    retrieval = json.loads((out / "runs" / "vilt" / "seed0" / "pretrained-retrieval" / "run.json").read_text())
    assert retrieval["options"]["num_negatives"] == 2  # the run's own task option
    assert json.loads((out / "runs" / "uniter" / "seed0" / "pretrained-retrieval" / "run.json").read_text())[
        "options"].get("num_negatives") != 2


def test_the_documentation_shows_the_complete_plugin():
    """docs/plugins.md carries this package's module and its complete pyproject.toml verbatim (the
    documentation test installs the package from them as pasted)."""
    blocks = re.findall(r"```(\w+)\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    assert (PACKAGE / "vlkit_vilt.py").read_text() in [code for lang, code in blocks if lang == "python"]
    assert (PACKAGE / "pyproject.toml").read_text() in [code for lang, code in blocks if lang == "toml"]
