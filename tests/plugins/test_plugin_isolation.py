"""Issue 54: one plugin never breaks vlkit. The package tests/plugins/vlkit_faulty has two entry points: one fails
on import after registering an objective, the other loads an executor whose ``wait`` returns None and a corruption
view that changes the batch's shape. At 455e9a4 the failed import broke every command (``import vlkit;
vlkit.list_models()`` included) as "looks like a bug in vlkit"; the executor ended in a ``TypeError`` inside the
scheduler; the view failed in ``VLBatch`` naming neither itself nor its plugin. Now the failed plugin is left out
whole and reported once naming its package and entry point, a name only it would give says so, and the others
are held to their contracts at first use, each error naming the plugin."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

import vlkit
from vlkit import registry
from vlkit.objectives.corruption import CorruptionContractError
from vlkit.registry import UnknownNameError

FAILED = "vlkit-faulty (entry point faulty_import = vlkit_faulty_import)"
WHY = "ModuleNotFoundError: No module named 'vlkit_faulty_missing_dependency'"


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def plugin(install_plugin):
    target = install_plugin("vlkit_faulty", "vlkit_faulty_parts", executors=("none_waiter",),
                            objectives=("shrunk_order", "half_registered"), corruptions=("shrunk_words",))
    patch = pytest.MonkeyPatch()
    patch.setattr(registry, "_plugin_failures", {})  # this module's failures, forgotten afterwards
    warned = _Warnings()
    registry.log.addHandler(warned)
    try:
        models = vlkit.list_models()
        vlkit.list_models()  # once: the plugins load on the first look-up
    finally:
        registry.log.removeHandler(warned)
    yield target, models, warned.messages
    patch.undo()


def test_a_plugin_that_fails_to_import_is_reported_once_and_left_out_whole(plugin):
    _, models, warned = plugin
    assert warned == [f"vlkit: plugin {FAILED} failed to load and is left out: {WHY}"]
    assert {"uniter", "vilbert", "meter"} <= set(models)
    assert "half_registered" not in vlkit.OBJECTIVES  # registered before the import failed: taken back
    assert "none_waiter" in vlkit.EXECUTORS and "shrunk_words" in vlkit.CORRUPTIONS  # the other entry point loaded
    assert registry.plugin_failures() == {FAILED: WHY}


def test_asking_for_a_name_only_the_failed_plugin_gives_says_it_failed_and_why(plugin):
    with pytest.raises(UnknownNameError) as caught:
        vlkit.OBJECTIVES.get("half_registered")
    assert f"plugin {FAILED} failed to load ({WHY}) and may be the one that provides it" in str(caught.value)


def test_import_vlkit_and_list_models_work_beside_the_broken_plugin_in_a_fresh_process(plugin):
    target = plugin[0]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *sys.path])}
    done = subprocess.run([sys.executable, "-c", "import vlkit; print(vlkit.list_models()); print(vlkit.list_models())"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "'uniter'" in done.stdout, done.stderr
    assert done.stderr == f"vlkit: plugin {FAILED} failed to load and is left out: {WHY}\n"  # once, one line


def test_an_executor_whose_wait_returns_none_is_named_with_its_plugin(plugin, tmp_path, capsys):
    from vlkit.cli import console

    out = tmp_path / "out"
    mine = tmp_path / "mine.yaml"
    mine.write_text("defaults: [smoke, _self_]\nseeds: [0]\ntasks: [vqa]\n"
                    "runs:\n  - {name: scratch, model: {name: uniter, preset: tiny}, objectives: null}\n")
    code = console(["compare", f"compare={mine}", "compare.executor=none_waiter", f"output_dir={out}", "threads=1",
                    "workers=1", "progress=false", f"cache_dir={tmp_path / 'cache'}"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert ("executor 'none_waiter' (vlkit_faulty_parts.NoneWaiter, plugin package vlkit-faulty): wait() returned "
            "None, not a list") in err, err
    assert "looks like a bug" not in err and "TypeError" not in err
    [session] = [json.loads(p.read_text()) for p in (out / "sessions").glob("*.json")]
    assert session["end"] == "error: ExecutorContractError" and session["ended"] is not None  # closed, not "running"


def test_a_corruption_view_that_changes_the_batch_shape_is_named_with_its_plugin(plugin, build_tiny):
    model = build_tiny("uniter", num_hidden_layers=1)
    pre = vlkit.build_pretraining(model, {"sampling": "sum", "objectives": {"shrunk_order": {}, "mlm": {}}})
    batch = model.example_batch(batch_size=4, seed=0)
    with pytest.raises(CorruptionContractError) as caught:
        pre(batch, step=0)
    length = batch.input_ids.shape[1]
    assert str(caught.value).startswith(
        "corruption view 'shrunk_words' (vlkit_faulty_parts.ShrunkWords, plugin package vlkit-faulty): apply() changed "
        f"the shape of input_ids (4, {length - 1}) (given (4, {length})), attention_mask"), caught.value


def test_builtin_views_keep_their_shapes(build_tiny):
    model = build_tiny("uniter", num_hidden_layers=1)
    pre = vlkit.build_pretraining(model, "uniter")
    torch.manual_seed(0)
    assert torch.isfinite(pre(model.example_batch(batch_size=4, seed=0), step=0).loss)


def _recipe_checks_trainer_keys() -> bool:
    from vlkit.models.recipe import Recipe
    from vlkit.registry import RegistrationError

    try:
        Recipe(trainer_preset={"warmup_stpes": 0.1}).check_contract("probe")
    except RegistrationError:
        return True
    return False


@pytest.mark.skipif(not _recipe_checks_trainer_keys(), reason="the recipe's trainer keys are checked when it registers "
                    "(vlkit.models.recipe, issue 54's recipe checks)")
def test_a_plugin_recipe_with_a_misspelt_trainer_key_is_refused_and_builtin_families_run(install_plugin, tmp_path):
    target = install_plugin("vlkit_typo_recipe", "vlkit_typo_recipe", family="typo_uniter")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *sys.path])}
    done = subprocess.run([sys.executable, "-m", "vlkit.cli", "compare", "compare=smoke", "dry_run=true",
                           "compare.seeds=[0]", f"cache_dir={tmp_path / 'cache'}", "progress=false"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "plugin vlkit-typo-recipe (entry point typo_recipe = vlkit_typo_recipe) failed to load" in done.stderr
    assert "warmup_stpes" in done.stderr and "recipe" in done.stderr, done.stderr
