"""Catalogue, class "messages": the culprit survives, a mistake gets ``did you mean``, not a vlkit-bug traceback."""
from __future__ import annotations

import json

import pytest
from reliability_helpers import jsonl_data, run_args

from vlkit.cli import user_error


def test_a_typo_in_a_model_field_of_a_comparison_run_gets_did_you_mean(tmp_path):
    from vlkit.environment import prepare_environment
    from vlkit.models.base import UnknownFieldError

    run_model = {"name": "uniter", "preset": "tiny", "hiden_size": 64}  # a run's model: in a comparison YAML
    with pytest.raises(UnknownFieldError, match=r"uniter models have no field model.hiden_size \(did you mean "
                                                r"'hidden_size'") as info:
        prepare_environment(run_model, {"name": "shapes", "num_images": 20}, cache=str(tmp_path / "cache"))
    assert user_error(info.value)  # one paragraph, not "this looks like a bug in vlkit"


def test_a_newer_runs_config_key_is_named_with_its_file(tmp_path, data, vlkit_console):
    store, caps, _ = data()
    pre = tmp_path / "pre"
    assert vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(pre, 1))[0] == 0
    config = pre / "model" / "config.json"
    meta = json.loads(config.read_text())
    meta["config"]["rope_theta"] = 10000.0  # a field a later vlkit added
    config.write_text(json.dumps(meta))
    code, _, err = vlkit_console("pretrain", f"init={pre}", *jsonl_data(caps, store), *run_args(tmp_path / "run"))
    assert code == 1 and "bug in vlkit" not in err and "Traceback" not in err
    assert f"{config} holds uniter config key(s) rope_theta that this vlkit" in err and "newer vlkit" in err


def test_a_truncated_parquet_shard_or_manifest_names_the_file(tmp_path):
    from vlkit.data.shards import MANIFEST, ShardError, read_manifest, write_shards

    records = [{"id": f"c{k}", "image_id": f"i{k}", "caption": "a red circle"} for k in range(12)]
    out = write_shards(records, tmp_path / "shards", shard_size=5)
    shard = out / "pairs-00001.parquet"
    shard.write_bytes(shard.read_bytes()[:40])
    with pytest.raises(ShardError, match=rf"{shard}: not a readable Parquet shard, truncated or corrupt"):
        read_manifest(out)
    manifest = out / MANIFEST
    manifest.write_text(manifest.read_text()[:30])
    with pytest.raises(ShardError, match=rf"{manifest}: not a vlkit pair-shard manifest"):
        read_manifest(out)


@pytest.mark.parametrize("value, char", [("~/runs/a", "~"), ("/data/réseau/a", "é")])
def test_an_unquoted_tilde_or_non_ascii_path_keeps_the_override_name(tmp_path, vlkit_console, value, char):
    code, _, err = vlkit_console("pretrain", f"trainer.output_dir={value}", "trainer.max_steps=1")
    assert code == 2 and f"cannot read the value of trainer.output_dir ({char!r} at column" in err
    assert f"trainer.output_dir='{value}'" in err  # the quoting that reads it
    code, out, err = vlkit_console("pretrain", f"trainer.output_dir='{value}'", "--cfg")
    assert code == 0 and f"output_dir: {value}" in out
