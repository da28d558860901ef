"""`vlkit convert` writes a run directory that `vlkit.from_pretrained`, `vlkit finetune init=` and
`vlkit evaluate checkpoint=` read."""
from __future__ import annotations

import json

import pytest
import torch

import vlkit
from official_fixtures import fixture_path, meta
from vlkit.cli import main
from vlkit.convert import from_official
from vlkit.data.tokenizers import run_tokenizer
from vlkit.train.pipeline import load_pretraining


def _config_file(tmp_path, name):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(meta(name)["config_json"]))
    return path


def test_convert_writes_what_from_pretrained_reads(tmp_path):
    config = _config_file(tmp_path, "vilbert_pretrain")
    dst = tmp_path / "vilbert"
    assert main(["convert", "family=vilbert", f"src={fixture_path('vilbert_pretrain.bin')}", f"dst={dst}",
                 f"config={config}"]) == 0
    reference = from_official("vilbert", fixture_path("vilbert_pretrain.bin"), config=config)
    model, pre = vlkit.from_pretrained(dst).eval(), load_pretraining(dst).eval()
    batch = reference.model.example_batch(batch_size=2)
    with torch.no_grad():
        expected = reference.model(batch)
        assert torch.equal(model(batch).joint, expected.joint) and torch.equal(pre.model(batch).joint, expected.joint)
        assert torch.equal(pre.objectives["itm"].logits(expected), reference.objectives["itm"].logits(expected))
    run = json.loads((dst / "run.json").read_text())
    assert run["kind"] == "pretrain" and "q_dense" in next(iter(run["converted"]["unused"]))
    assert run["tokenizer"] == "bert-base-uncased"  # ViLBERT's official tokenizer: what init= / checkpoint= use
    with pytest.raises(FileExistsError, match="not empty"):
        main(["convert", "family=vilbert", f"src={fixture_path('vilbert_pretrain.bin')}", f"dst={dst}", f"config={config}"])


def test_convert_a_task_with_its_answers(tmp_path):
    answers = tmp_path / "ans2label.json"
    answers.write_text(json.dumps({f"answer{k}": k for k in range(23)}))
    dst = tmp_path / "vqa"
    assert main(["convert", "family=meter", f"src={fixture_path('meter_clip16_vqa.ckpt')}", f"dst={dst}",
                 f"answers={answers}", "+config.text_config.num_attention_heads=2"]) == 0
    run = json.loads((dst / "run.json").read_text())
    assert run["task"] == "vqa" and run["options"]["answers"][:2] == ["answer0", "answer1"]
    assert run["tokenizer"] == "roberta-base"  # the RoBERTa text tower's, not bert-base-uncased
    assert vlkit.from_pretrained(dst).config.image_size == 48


def _retrieval_data(tmp_path, uniter_store):
    """A Karpathy json over the UNITER fixture's four images and a word-piece vocabulary of its 128 ids."""
    from transformers import BertTokenizer

    tokens = ["[PAD]", *(f"[unused{i}]" for i in range(1, 100)), "[UNK]", "[CLS]", "[SEP]", "[MASK]",
              *(f"w{i}" for i in range(104, 128))]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n")
    BertTokenizer(str(tmp_path / "vocab.txt")).save_pretrained(str(tmp_path / "tokenizer"))
    g = torch.Generator().manual_seed(0)

    def caption():
        return " ".join(f"w{int(i)}" for i in torch.randint(104, 128, (6,), generator=g))

    images = [{"filename": f"img{i}.jpg", "split": split, "imgid": i,
               "sentences": [{"raw": caption(), "sentid": 10 * i + k + (100 if split == "val" else 0)}
                             for k in range(2 if split == "train" else 1)]}
              for split in ("train", "val") for i in range(4)]
    (tmp_path / "karpathy.json").write_text(json.dumps({"images": images}))
    karpathy = tmp_path / "karpathy.json"
    return [f"cache_dir={tmp_path / 'cache'}", "data=coco", f"data.path={karpathy}",
            f"data.tokenizer={tmp_path / 'tokenizer'}", f"data.image.path={uniter_store}", "task=retrieval",
            "task.source=files", f"task.path={karpathy}", "task.eval_splits=[val]", "eval_splits=[val]"]


def test_converted_checkpoint_finetunes_and_evaluates(tmp_path, uniter_store):
    config = _config_file(tmp_path, "uniter_pretrain")
    dst, ft = tmp_path / "uniter", tmp_path / "ft"
    assert main(["convert", "family=uniter", f"src={fixture_path('uniter_pretrain.pt')}", f"dst={dst}",
                 f"config={config}"]) == 0
    data = _retrieval_data(tmp_path, uniter_store)
    assert main(["evaluate", f"checkpoint={dst}", *data, f"output={tmp_path / 'zero_shot.json'}"]) == 0
    assert "val/ir_r1" in json.loads((tmp_path / "zero_shot.json").read_text())
    assert main(["finetune", f"init={dst}", *data, f"trainer.output_dir={ft}", "trainer.max_steps=2",
                 "trainer.batch_size=4", "trainer.warmup=1", "trainer.progress=false", "trainer.trackers=[]"]) == 0
    run = json.loads((ft / "run.json").read_text())
    assert main(["evaluate", f"checkpoint={ft}", f"cache_dir={tmp_path / 'cache'}"]) == 0
    assert json.loads((ft / "eval.json").read_text()) == run["metrics"]


def test_converted_run_keeps_the_tokenizer_it_is_given(tmp_path, uniter_store):
    config = _config_file(tmp_path, "uniter_pretrain")
    data = _retrieval_data(tmp_path, uniter_store)
    convert = ["convert", "family=uniter", f"src={fixture_path('uniter_pretrain.pt')}", f"config={config}"]
    with pytest.raises(ValueError, match=r"tokenizer=shapes has \d+ tokens but .*uniter_pretrain.pt has 128 word"):
        main([*convert, f"dst={tmp_path / 'wrong'}", "tokenizer=shapes"])
    assert not (tmp_path / "wrong").exists()  # refused before anything is written
    dst = tmp_path / "uniter"
    assert main([*convert, f"dst={dst}", f"tokenizer={tmp_path / 'tokenizer'}"]) == 0
    assert run_tokenizer(dst) == str(dst / "tokenizer")
    no_tokenizer = [a for a in data if not a.startswith("data.tokenizer=")]  # the run's own tokenizer/
    assert main(["evaluate", f"checkpoint={dst}", *no_tokenizer, f"output={tmp_path / 'zero_shot.json'}"]) == 0
