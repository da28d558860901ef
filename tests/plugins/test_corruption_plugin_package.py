"""Issue 45: a corruption view and the objective that scores it from an outside package
(tests/plugins/vlkit_wordorder), found through the ``vlkit.plugins`` entry point and touching no vlkit file: the
objective trains on the view, ``vlkit pretrain`` runs a mix of it and records its figures, and the view's
options block (``word_reversal``) joins the mix, validated and its key its own."""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch

import vlkit
from vlkit.cli import UsageError, main
from vlkit.objectives.mix import load_mix
from vlkit.train.preflight import PreflightError

PACKAGE = Path(__file__).resolve().parent / "vlkit_wordorder"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
MIX = {"sampling": "sum", "word_reversal": {"prob": 0.5}, "objectives": {"word_order": {}, "mlm": {}}}


@pytest.fixture(scope="module", autouse=True)
def plugin(install_plugin):
    """The package pip-installed into a temporary target (found through its entry point), then removed."""
    return install_plugin("vlkit_wordorder", "vlkit_wordorder", objectives=("word_order",),
                          corruptions=("reversed_words",))


@pytest.fixture
def mix_file(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text("sampling: sum\nword_reversal: {prob: 0.5}\nobjectives: {word_order: {}, mlm: {}}\n")
    return path


def test_a_plugin_objective_trains_on_a_plugin_view(plugin, build_tiny):
    assert "reversed_words" in vlkit.CORRUPTIONS and "word_order" in vlkit.OBJECTIVES
    assert sys.modules["vlkit_wordorder"].__file__.startswith(str(plugin))  # the installed copy, found by entry point
    assert "word_reversal" in load_mix(MIX)
    torch.manual_seed(0)
    model = build_tiny("uniter", num_hidden_layers=1)
    pre = vlkit.build_pretraining(model, MIX)
    assert pre.corruptions["reversed_words"].options == {"prob": 0.5}
    assert [sorted(views) for views, _ in pre.plan(pre.units)] == [["reversed_words"], ["text"]]
    assert "reversed_words" not in pre.mask_views  # not a masking view: a joint pass would not add it
    batch = model.example_batch(batch_size=8, seed=0)
    batch = batch.replace(attention_mask=torch.ones_like(batch.attention_mask))  # every caption fills its row
    optimizer = torch.optim.Adam(pre.parameters(), lr=1e-3)
    pre.train()
    losses = []
    for step in range(60):
        out = pre(batch, step=step)
        losses.append(out.metrics["word_order/loss"].item())
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    assert pre.objectives["word_order"].head.weight.grad.abs().sum() > 0
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.5 * first, (first, last)


def test_pretrain_runs_the_plugin_mix_from_the_command_line(command_args, cache, mix_file, tmp_path):
    out = tmp_path / "pre"
    assert main(["pretrain", f"objectives={mix_file}", "objectives.word_reversal.prob=0.8",
                 *command_args(cache, out)]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["objectives"]["word_reversal"] == {"prob": 0.8}  # the command line's options block reached the mix
    assert set(run["objectives"]["objectives"]) == {"word_order", "mlm"}
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert s["objective/word_order"] == s["objective/mlm"] == 1.0  # sampling: sum, both at every step
        assert all(math.isfinite(s[k]) for k in ("word_order/loss", "word_order/acc", "mlm/loss", "loss"))


def test_the_views_options_block_is_validated_and_its_key_is_its_own(build_tiny, command_args, cache, mix_file,
                                                                    tmp_path):
    with pytest.raises(KeyError, match="word_reversal has unknown option.s. rate; it takes prob"):
        vlkit.build_pretraining(build_tiny("uniter"), {**MIX, "word_reversal": {"rate": 0.5}})
    out = tmp_path / "pre"
    with pytest.raises(PreflightError, match=r"objectives: word_reversal has unknown option\(s\) rate; it takes prob"):
        main(["pretrain", f"objectives={mix_file}", "+objectives.word_reversal.rate=0.5", *command_args(cache, out)])
    with pytest.raises(UsageError, match=re.escape("unknown key 'objectives.word_reversal.rate'")):
        main(["pretrain", f"objectives={mix_file}", "objectives.word_reversal.rate=0.5", *command_args(cache, out)])
    assert not out.exists()  # refused before anything was written
    clash = type("Clash", (vlkit.Corruption,), {"name": "clash", "options_key": "word_reversal"})
    with pytest.raises(vlkit.registry.RegistrationError, match="options_key 'word_reversal' is taken by view "
                                                               "'reversed_words'"):
        vlkit.register_corruption()(clash)
    assert "clash" not in vlkit.CORRUPTIONS


def test_the_page_shows_the_plugin_as_tested():
    blocks = re.findall(r"```(\w+)\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    assert (PACKAGE / "vlkit_wordorder.py").read_text() in [code for lang, code in blocks if lang == "python"]
    assert (PACKAGE / "pyproject.toml").read_text() in [code for lang, code in blocks if lang == "toml"]
