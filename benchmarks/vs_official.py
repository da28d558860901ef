"""vlkit against the official implementations: one training step (forward + backward + AdamW) of each
family's base preset, both sides on the same weights and inputs, timed alternately in separate processes.

    python benchmarks/vs_official.py --official /path/to/checkouts \\
        --official-python /path/to/official-venv/bin/python [--cases vilbert uniter_itm uniter_mlm meter]

``--official`` is a local checkout of an official repository (``family=PATH``, repeatable) or a folder
holding them (``vilbert`` or ``vilbert-multi-task``, ``uniter`` or ``UNITER``, ``meter`` or ``METER``).
Nothing of them is copied here: the official side runs in its own interpreter (``--official-python``,
e.g. a venv with transformers 4.6.0 for METER) with the import stubs of the official-code notes
(``torch._six``, boto3, tensorboardX, apex's FusedLayerNorm -> ``nn.LayerNorm``, horovod, lmdb,
pytorch_lightning, sacred; CLIP and roberta-base built from their configs instead of downloaded, UNITER's
two uint8-mask patches for modern torch). Every case:

1. the official child builds the official model (its own initialisation) and saves its weights;
2. the vlkit child loads them (a key map per family), draws a batch, corrupts it with vlkit's
   pre-training mixture (masks, negatives) and writes the official inputs of those very choices;
3. parity, dropout off: both sides run one step with the official AdamW rule (lr 1e-4, wd 0.01 with the
   official no-decay names, betas (0.9, 0.98), eps 1e-6); the official child compares the loss and every
   updated parameter with vlkit's;
4. timing, dropout as configured (0.1): ``--rounds`` rounds, each running an official and a vlkit child
   (order alternating), each timing ``--steps`` steps after one warm-up step; ratios are official / vlkit
   per round (their median is reported), peak memory is each child's peak RSS (``peak_mb``) and its
   growth over the model and inputs (``step_mb``).

The official optimizer is the official class (transformers 4.6 ``AdamW`` for ViLBERT's
``pytorch_transformers`` one, which has the same code; UNITER's ``optim/adamw.py``; METER's
``transformers.optimization.AdamW``). vlkit variants (``--variant name=JSON``) choose the AdamW rule and
implementation (``adamw_rule``: ``hf`` is the official update, ``torch`` torch's) and speed options.

Writes ``benchmarks/results/vs_official.json`` and prints a table.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CASES = ("vilbert", "uniter_itm", "uniter_mlm", "meter")
FAMILY = {"vilbert": "vilbert", "uniter_itm": "uniter", "uniter_mlm": "uniter", "meter": "meter"}
REPO_NAMES = {"vilbert": ("vilbert", "vilbert-multi-task"), "uniter": ("uniter", "UNITER"),
              "meter": ("meter", "METER")}
DESCRIPTION = {"vilbert": "ViLBERT train (MLM + region KL + ITM)", "uniter_itm": "UNITER ITM + WRA train",
               "uniter_mlm": "UNITER MLM train", "meter": "METER CLIP16 + RoBERTa train (MLM pass + ITM pass)"}
OPTIM = dict(lr=1e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
NO_DECAY = ("bias", "LayerNorm.bias", "LayerNorm.weight")  # the official no-decay names (BERT rule)
DEFAULT_VARIANT = {"adamw_rule": "hf", "adamw_impl": "fused"}


def rss_mb() -> float:
    """Current resident set size (Linux /proc), MB."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def optimizer_groups(named_params, no_decay=NO_DECAY) -> list[dict]:
    """Two groups by the official no-decay names (``named_params``: (name, parameter) pairs)."""
    decay, plain = [], []
    for name, p in named_params:
        if p.requires_grad:
            (plain if any(s in name for s in no_decay) else decay).append(p)
    return [{"params": decay, "weight_decay": OPTIM["weight_decay"]}, {"params": plain, "weight_decay": 0.0}]


def time_steps(step, steps: int) -> dict:
    """One warm-up step, then ``steps`` timed steps; ``step()`` returns its (forward, backward, optimizer) seconds."""
    import torch

    base = rss_mb()
    step()
    parts = []
    for _ in range(steps):
        parts.append(step())
    totals = [sum(p[:3]) for p in parts]
    return {"step_s": statistics.median(totals), "steps_s": totals, "min_step_s": min(totals),
            "cpu_s": statistics.median(p[3] for p in parts),
            "forward_s": statistics.median(p[0] for p in parts), "backward_s": statistics.median(p[1] for p in parts),
            "optimizer_s": statistics.median(p[2] for p in parts), "peak_mb": peak_mb(), "base_mb": base,
            "step_mb": peak_mb() - base, "threads": torch.get_num_threads()}


def timed_step(loss_fn, model, optimizer):
    """A training step returning its (forward, backward, optimizer) wall seconds and its process CPU seconds."""
    c0, t0 = time.process_time(), time.perf_counter()
    loss = loss_fn()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    optimizer.step()
    model.zero_grad(set_to_none=True)
    return t1 - t0, t2 - t1, time.perf_counter() - t2, time.process_time() - c0


# ================================================================================ official side
def _mod(name: str, **attrs):
    """Register an import stub ``name`` (a package, so that submodules can be stubbed too)."""
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__path__ = []
    sys.modules[name] = m
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, m)
    return m


class _Noop:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return args[0] if args else None


def _stub_vilbert() -> None:
    _mod("torch._six", inf=math.inf)  # gone in torch 2
    for name in ("boto3", "botocore"):
        _mod(name)
    _mod("botocore.exceptions", ClientError=type("ClientError", (Exception,), {}))
    _mod("tensorboardX", SummaryWriter=_Noop)
    for name in ("requests", "tqdm"):  # used by utils.py's downloads only
        try:
            __import__(name)
        except ImportError:
            _mod(name, tqdm=_Noop)


def _stub_uniter() -> None:
    from torch import nn

    _mod("apex")
    _mod("apex.normalization")
    _mod("apex.normalization.fused_layer_norm", FusedLayerNorm=nn.LayerNorm)  # same parameters and math
    _mod("horovod")
    _mod("horovod.torch", rank=lambda: 0, size=lambda: 1, local_size=lambda: 1, local_rank=lambda: 0)
    _mod("lmdb")
    _mod("lz4")
    _mod("lz4.frame", compress=lambda b: b, decompress=lambda b: b)
    _mod("msgpack", dumps=None, loads=None)
    _mod("msgpack_numpy", patch=lambda: None)
    if "cytoolz" not in sys.modules:
        try:
            import cytoolz  # noqa: F401
        except ImportError:
            import toolz
            sys.modules["cytoolz"] = toolz


def _stub_meter() -> None:
    from torch import nn

    class AttrDict(dict):
        def __getattr__(self, key):
            return self[key]

    class LightningModule(nn.Module):
        def save_hyperparameters(self):
            self.hparams = AttrDict(config=sys._getframe(1).f_locals["config"])

        @property
        def device(self):
            return next(self.parameters()).device

        def log(self, *args, **kwargs):
            pass

    class Experiment:
        def __init__(self, *args, **kwargs):
            pass

        def config(self, f):
            return f

        named_config = automain = config

    _mod("pytorch_lightning", LightningModule=LightningModule, LightningDataModule=object, seed_everything=_Noop())
    _mod("pytorch_lightning.metrics", Metric=_Noop)
    _mod("sacred", Experiment=Experiment)
    _mod("meter.gadgets.my_metrics", Accuracy=_Noop, VQAScore=_Noop, Scalar=_Noop)


def _config_locals(fn) -> dict:
    """The local variables of a sacred config function (what sacred records as the config)."""
    captured: dict = {}

    def profile(frame, event, arg):
        if event == "return" and frame.f_code is fn.__code__:
            captured.update(frame.f_locals)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return captured


class Official:
    """The official model of a case, its inputs from vlkit's corruption, its loss and optimizer."""

    def __init__(self, case: str, repo: str, image_size: int):
        import torch

        self.case, self.repo = case, repo
        sys.path.insert(0, repo)
        os.chdir(repo)
        torch.manual_seed(0)
        getattr(self, f"_build_{FAMILY[case]}")(image_size)

    # -- models --------------------------------------------------------------------------------
    def _build_vilbert(self, image_size: int) -> None:
        _stub_vilbert()
        from vilbert.vilbert import BertConfig, BertForMultiModalPreTraining

        config = BertConfig.from_json_file(os.path.join(self.repo, "config", "bert_base_6layer_6conect.json"))
        config.v_target_size, config.visual_target = 1601, 0  # train_concap.py
        self.model = BertForMultiModalPreTraining(config)

    def _build_uniter(self, image_size: int) -> None:
        _stub_uniter()
        import model.ot as uot
        import model.pretrain as upre
        import torch
        from model.model import UniterConfig
        from model.pretrain import UniterForPretraining

        def trace(x):  # model/ot.py trace() with a bool eye (masked_select rejects uint8)
            n = x.size(-1)
            eye = torch.eye(n, dtype=torch.bool, device=x.device).unsqueeze(0).expand_as(x)
            return x.masked_select(eye).contiguous().view(x.size(0), n).sum(dim=-1, keepdim=False)

        uot.trace = trace
        ot_dist = upre.optimal_transport_dist
        # the pads of data/itm.py _compute_pad are uint8, which masked_fill_ rejects: cast to bool
        upre.optimal_transport_dist = lambda t, i, tp, ip, *a, **k: ot_dist(t, i, tp.bool(), ip.bool(), *a, **k)
        config = UniterConfig.from_json_file(os.path.join(self.repo, "config", "uniter-base.json"))
        self.model = UniterForPretraining(config, img_dim=2048, img_label_dim=1601)

    def _build_meter(self, image_size: int) -> None:
        _stub_meter()
        import meter.config as mcfg
        import meter.modules.clip_model as clip_model
        import meter.modules.meter_module as meter_module
        from transformers import RobertaConfig, RobertaModel

        cfg = _config_locals(mcfg.config)
        for name in ("task_mlm_itm_clip_bert", "clip16", "text_roberta"):
            cfg.update(_config_locals(getattr(mcfg, name)))
        cfg["image_size"] = image_size

        def build_clip(name, resolution_after=224):  # ViT-B/16 (OpenAI's JIT archive sizes), random weights
            return clip_model.CLIP(512, 224, 12, 768, 16, 77, 49408, 512, 8, 12, resolution_after)

        def roberta_base(cls, name, *args, **kwargs):  # roberta-base's config.json, random weights
            return RobertaModel(RobertaConfig(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1,
                                              layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2))

        meter_module.build_model = build_clip
        RobertaModel.from_pretrained = classmethod(roberta_base)
        self.model = meter_module.METERTransformerSS(cfg)
        self.model.current_tasks = ["mlm", "itm"]

    # -- inputs and loss ---------------------------------------------------------------------------
    def load_inputs(self, path: str) -> None:
        import torch

        self.inputs = torch.load(path, weights_only=False)
        if self.case == "uniter_itm":
            from data.itm import itm_ot_collate

            self.batch = itm_ot_collate(self.inputs["examples"])
        elif self.case == "uniter_mlm":
            from data.mlm import mlm_collate

            self.batch = mlm_collate(self.inputs["examples"])

    def loss(self):
        import torch

        x = self.inputs
        if self.case == "vilbert":
            lm, img, itm = self.model(x["input_ids"], x["image_feat"], x["image_loc"], x["token_type_ids"],
                                      x["attention_mask"], x["image_attention_mask"], x["masked_lm_labels"],
                                      x["image_label"], x["image_target"], x["next_sentence_label"])
            return (lm + img + itm).sum()  # train_concap.py: the three losses summed
        if self.case == "uniter_itm":
            itm_loss, (ot_pos, ot_neg) = self.model(self.batch, task="itm", compute_loss=True)
            ot_loss = (ot_pos.sum() - ot_neg.sum()) / (ot_pos.size(0) + ot_neg.size(0))
            return itm_loss.mean() + 0.1 * ot_loss  # pretrain.py, itm_ot_lambda 0.1
        if self.case == "uniter_mlm":
            return self.model(self.batch, task="mlm", compute_loss=True).mean()
        perm = x["itm_perm"]  # compute_itm's randperm, set to the pairs vlkit drew
        randperm, torch.randperm = torch.randperm, lambda n, *a, **k: perm.clone()
        try:
            out = self.model(x["batch"])
        finally:
            torch.randperm = randperm
        return sum(v for k, v in out.items() if "loss" in k)  # meter_module.training_step

    def optimizer(self):
        if self.case == "uniter_itm" or self.case == "uniter_mlm":
            from optim.adamw import AdamW
        else:  # METER's; pytorch_transformers' AdamW (ViLBERT) is the same code
            from transformers.optimization import AdamW
        groups = optimizer_groups(self.model.named_parameters())
        return AdamW(groups, lr=OPTIM["lr"], betas=OPTIM["betas"], eps=OPTIM["eps"])


def official_child(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    side = Official(args.case, args.repo, args.image_size)
    if args.phase == "init":
        torch.save(side.model.state_dict(), work / "official_init.pt")
        return {"params": sum(p.numel() for p in side.model.parameters())}
    side.model.load_state_dict(torch.load(work / "official_init.pt"))
    side.load_inputs(str(work / "official_inputs.pt"))
    optimizer = side.optimizer()
    if args.phase == "parity":
        side.model.eval()
        loss = side.loss()
        loss.backward()
        optimizer.step()
        ref = torch.load(work / "vlkit_parity.pt")
        state = side.model.state_dict()
        diffs = {k: (state[k] - v).abs().max().item() for k, v in ref["params"].items()}
        moved = {k: (state[k] - v).abs().max().item() for k, v in ref["init"].items()}
        worst = max(diffs, key=diffs.get)
        return {"official_loss": loss.item(), "vlkit_loss": ref["loss"], "loss_diff": abs(loss.item() - ref["loss"]),
                "max_param_diff": diffs[worst], "worst_param": worst, "params_compared": len(diffs),
                "max_update": max(moved.values())}
    side.model.train()
    return time_steps(lambda: timed_step(side.loss, side.model, optimizer), args.steps)


# ================================================================================ vlkit side
def _keymap(case: str, state: dict) -> dict:
    """official key -> vlkit key (of the `Pretraining` module) for the weights vlkit has."""
    family = FAMILY[case]
    out = {}
    for key in state:
        new = None
        if family == "vilbert":
            if key.startswith("bert.") and ".q_dense" not in key:  # q_dense: unused (official notes 1.2)
                new = "model." + key[len("bert."):]
            for old, rep in (("cls.predictions.", "objectives.mlm.predictions."),
                             ("cls.imagePredictions.", "objectives.mrc_kl.predictions."),
                             ("cls.bi_seq_relationship.", "objectives.itm.itm_head.fc.")):
                if key.startswith(old):
                    new = rep + key[len(old):]
        elif family == "uniter":
            for old, rep in (("uniter.", "model."), ("cls.predictions.", "objectives.mlm.predictions."),
                             ("itm_output.", "objectives.itm.itm_head.fc."),
                             ("feat_regress.net.0.", "objectives.mrfr.net.dense."),
                             ("feat_regress.net.2.", "objectives.mrfr.net.LayerNorm."),
                             ("feat_regress.bias", "objectives.mrfr.bias"),
                             ("region_classifier.net.0.", "objectives.mrc_kl.predictions.transform.dense."),
                             ("region_classifier.net.2.", "objectives.mrc_kl.predictions.transform.LayerNorm."),
                             ("region_classifier.net.3.", "objectives.mrc_kl.predictions.decoder.")):
                if key.startswith(old):
                    new = rep + key[len(old):]
        else:
            if key.startswith("text_transformer.") and ".pooler." not in key and "position_ids" not in key:
                new = "model." + key
            elif key.startswith(("cross_modal_", "token_type_embeddings")):
                new = "model." + key
            elif key.startswith("mlm_score."):
                new = "objectives.mlm.predictions." + key[len("mlm_score."):]
            elif key.startswith("itm_score.fc."):
                new = "objectives.itm.itm_head.fc." + key[len("itm_score.fc."):]
        if new is not None:
            out[key] = new
    if family == "meter":  # CLIP's visual keys -> timm ViT keys (METER keeps 11 blocks)
        from vlkit.models.encoders import clip_visual_key_to_timm

        layers = len({k.split(".")[4] for k in state if k.startswith("vit_model.visual.transformer.resblocks.")})
        for key in state:
            if key.startswith("vit_model.visual.") and clip_visual_key_to_timm(key, layers):
                out[key] = "model.vit_model." + clip_visual_key_to_timm(key, layers)
    return out


def _to_vlkit(case: str, key: str, value):
    """An official tensor in vlkit's layout (CLIP's class / position embeddings gain a batch dim)."""
    if case == "meter" and key.endswith(("visual.class_embedding",)):
        return value.reshape(1, 1, -1)
    if case == "meter" and key.endswith("visual.positional_embedding"):
        return value.unsqueeze(0)
    return value


class Vlkit:
    """vlkit's `Pretraining` module of a case with the official weights, and its batch."""

    MIX = {
        "vilbert": "vilbert",
        "uniter_itm": {"sampling": "sum", "masking": "conditional",
                       "objectives": {"itm": {"negatives": "image", "split": "bernoulli", "neg_prob": 0.5,
                                              "wra": {"weight": 0.1, "beta": 0.5, "iterations": 50, "k": 1}}}},
        "uniter_mlm": {"sampling": "sum", "masking": "conditional",
                       "text_masking": {"prob": 0.15, "policy": "bernoulli", "force_one": True},
                       "objectives": {"mlm": {}}},
        "meter": "meter",
    }

    def __init__(self, args, options: dict):
        import torch

        import vlkit
        from vlkit.objectives import build_pretraining
        from vlkit.objectives.base import TokenInfo

        self.case, self.args, self.options = args.case, args, options
        family = FAMILY[args.case]
        overrides = {"image_size": args.image_size} if family == "meter" else {}
        torch.manual_seed(0)
        model = vlkit.build_model(family, preset="clip16-roberta" if family == "meter" else "base", **overrides)
        self.tokens = {
            "vilbert": TokenInfo(103, (0, 100, 101, 102, 103), 30522),  # bert-base-uncased
            "uniter": TokenInfo(103, (0, 100, 101, 102, 103), 28996, random_range_start=106),  # bert-base-cased, '!'
            "meter": TokenInfo(50264, (0, 1, 2, 3, 50264), 50265),  # roberta-base
        }[family]
        self.pre = build_pretraining(model, self.MIX[args.case], seed=0)
        self.pre.tokens = self.tokens
        self.model = model

    def load_official(self, path) -> dict:
        """Load the official weights; returns official key -> vlkit key."""
        import torch

        state = torch.load(path)
        keys = _keymap(self.case, state)
        own = self.pre.state_dict()
        missing = sorted(set(own) - set(keys.values()))
        if missing:
            raise KeyError(f"{self.case}: no official weight for {missing[:8]}")
        self.pre.load_state_dict({v: _to_vlkit(self.case, k, state[k]) for k, v in keys.items() if v in own},
                                 strict=True)
        return {k: v for k, v in keys.items() if v in own}

    def batch(self):
        """The clean batch: ``batch`` examples, ``text_len`` tokens, ``regions`` regions / ``image_size`` pixels."""
        import torch

        from vlkit.types import VLBatch

        a, family = self.args, FAMILY[self.case]
        g = torch.Generator().manual_seed(1)
        b, t, k = a.batch, a.text_len, a.regions
        cls_, sep, low = (0, 2, 3) if family == "meter" else (101, 102, 999)
        ids = torch.randint(low, self.tokens.vocab_size, (b, t), generator=g)
        ids[:, 0], ids[:, -1] = cls_, sep
        fields = {"input_ids": ids, "attention_mask": torch.ones(b, t, dtype=torch.long),
                  "image_ids": [f"img{i}" for i in range(b)]}
        if family == "meter":
            fields["pixel_values"] = torch.randn(b, 3, a.image_size, a.image_size, generator=g)
        else:
            xy = torch.rand(b, k, 2, generator=g) * 0.6
            wh = torch.rand(b, k, 2, generator=g) * 0.35 + 0.05
            fields.update(region_feats=torch.rand(b, k, 2048, generator=g) * 2,
                          region_boxes=torch.cat([xy, xy + wh], -1), region_mask=torch.ones(b, k, dtype=torch.long),
                          region_soft_labels=torch.softmax(torch.randn(b, k, 1601, generator=g) * 2, -1))
        return VLBatch(**fields)

    def passes(self, batch):
        """The corrupted batches and contexts of step 0, exactly as `Pretraining.forward` draws them."""
        import torch

        pre = self.pre
        generator = torch.Generator().manual_seed(pre.seed * 1_000_003 + 0)
        return [(views, *pre.corrupt(batch, views, generator)) for views, _ in pre.plan(pre.active_units(0))]

    def official_inputs(self, batch) -> dict:
        """The official inputs of the choices vlkit's mixture makes at step 0."""
        import torch

        from vlkit.models.embeddings import box_locations
        from vlkit.objectives.masking import IGNORE_INDEX

        passes = self.passes(batch)
        if self.case == "vilbert":
            (_, c, ctx), = passes
            rows = ctx.itm_match.view(-1, 1)
            # the [IMG] token: the official pre-training loader's rule (the masked features' sum over the
            # slots neither masked nor overlapping a masked region), which vlkit's model applies to this batch
            img = self.model.global_feature(c).unsqueeze(1)
            boxes = torch.cat([c.region_boxes.new_tensor([0.0, 0.0, 1.0, 1.0]).expand(len(img), 1, 4),
                               c.region_boxes], 1)
            labels = torch.where((ctx.mlm_labels != IGNORE_INDEX) & rows, ctx.mlm_labels, -1)
            return {"input_ids": c.input_ids, "image_feat": torch.cat([img, c.region_feats], 1),
                    "image_loc": box_locations(boxes, 5), "token_type_ids": torch.zeros_like(c.input_ids),
                    "attention_mask": c.attention_mask,
                    "image_attention_mask": torch.cat([torch.ones_like(c.region_mask[:, :1]), c.region_mask], 1),
                    "masked_lm_labels": labels, "image_label": torch.where(ctx.region_masked & rows, 1, -1),
                    "image_target": ctx.original.region_soft_labels,
                    "next_sentence_label": (~ctx.itm_match).long()}  # ViLBERT: 0 = aligned
        if self.case.startswith("uniter"):
            (_, c, ctx), = passes
            examples = []
            for i in range(c.batch_size):
                tl, nbb = int(c.attention_mask[i].sum()), int(c.region_mask[i].sum())
                item = [c.input_ids[i, :tl], c.region_feats[i, :nbb], box_locations(c.region_boxes[i, :nbb], 7),
                        torch.ones(tl + nbb, dtype=torch.long)]
                if self.case == "uniter_itm":
                    item.append(ctx.itm_match[i:i + 1].long())  # UNITER: 1 = matched
                else:
                    lab = ctx.mlm_labels[i, :tl]
                    item.append(torch.where(lab == IGNORE_INDEX, -1, lab))
                examples.append(tuple(item))
            return {"examples": examples}
        (_, mlm, mctx), (_, itm, ictx) = passes  # METER: the MLM pass, then the ITM pass
        match = ictx.itm_match
        perm = torch.zeros(len(match), dtype=torch.long)
        perm[match] = torch.arange(int(match.sum()))
        perm[~match] = int(match.sum()) + torch.arange(int((~match).sum()))
        return {"batch": {"text": [""] * batch.batch_size, "text_ids": batch.input_ids,
                          "text_ids_mlm": mlm.input_ids, "text_labels_mlm": mctx.mlm_labels,
                          "text_labels": torch.full_like(batch.input_ids, -100), "text_masks": batch.attention_mask,
                          "image": [batch.pixel_values], "false_image_0": [itm.pixel_values]},
                "itm_perm": perm}

    def optimizer(self):
        from vlkit.train.optim import build_optimizer

        return build_optimizer(self.pre, OPTIM["lr"], OPTIM["betas"], OPTIM["eps"], OPTIM["weight_decay"],
                               no_decay="bert_timm" if FAMILY[self.case] == "meter" else "bert",
                               rule=self.options.get("adamw_rule", "hf"), impl=self.options.get("adamw_impl", "fused"))


def vlkit_child(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    options = json.loads(args.options or "{}")
    side = Vlkit(args, options)
    keys = side.load_official(work / "official_init.pt")
    batch = side.batch()
    if args.phase == "inputs":
        torch.save(side.official_inputs(batch), work / "official_inputs.pt")
        return {"params": sum(p.numel() for p in side.model.parameters())}
    optimizer = side.optimizer()
    if args.phase == "parity":
        side.pre.eval()
        own = dict(side.pre.named_parameters(remove_duplicate=False))
        init = {k: own[v].detach().clone() for k, v in keys.items()}
        loss = side.pre(batch, step=0).loss
        loss.backward()
        optimizer.step()
        params = {k: own[v].detach().clone() for k, v in keys.items()}
        moved = {k for k in params if not torch.equal(params[k], init[k])}  # trained by this step
        torch.save({"loss": loss.item(), "params": {k: _from_vlkit(k, params[k]) for k in moved},
                    "init": {k: _from_vlkit(k, init[k]) for k in moved}}, work / "vlkit_parity.pt")
        return {"vlkit_loss": loss.item(), "params_moved": len(moved)}
    bf16 = options.get("autocast") == "bf16"  # bf16 autocast (the OT and the losses stay fp32)
    extra = {}
    if bf16:  # how far bf16 moves the loss from fp32 (dropout off)
        side.pre.eval()
        with torch.no_grad():
            fp32 = side.pre(batch, step=0).loss.item()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                extra = {"bf16_loss_diff": abs(side.pre(batch, step=0).loss.item() - fp32), "fp32_loss": fp32}
    side.pre.train()

    def loss():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return side.pre(batch, step=0).loss

    return {**time_steps(lambda: timed_step(loss, side.pre, optimizer), args.steps), **extra}


def _from_vlkit(key: str, value):
    if key.endswith(("visual.class_embedding", "visual.positional_embedding")):
        return value.reshape(value.shape[-2:] if key.endswith("positional_embedding") else value.shape[-1:])
    return value


# ================================================================================ parent
def find_repo(official: list[str], family: str) -> str:
    for entry in official:
        if "=" in entry:
            name, path = entry.split("=", 1)
            if name == family:
                return path
            continue
        for name in REPO_NAMES[family]:
            if (Path(entry) / name).is_dir():
                return str(Path(entry) / name)
        if Path(entry).name in REPO_NAMES[family]:
            return entry
    raise SystemExit(f"--official: no checkout of the official {family} code among {official}")


def run_child(python: str, args, side: str, case: str, phase: str, work: Path, repo: str, options: str = "") -> dict:
    cmd = [python, __file__, "--child", side, "--case", case, "--phase", phase, "--work", str(work), "--repo", repo,
           "--threads", str(args.threads), "--steps", str(args.steps), "--batch", str(args.batch),
           "--text-len", str(args.text_len), "--regions", str(args.regions), "--image-size", str(args.image_size)]
    if options:
        cmd += ["--options", options]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               PYTHONHASHSEED="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if side == "vlkit":
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else root
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(work))
    if proc.returncode != 0:
        raise RuntimeError(f"{side} {case} {phase} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_case(args, case: str, variants: dict[str, str]) -> dict:
    repo = find_repo(args.official, FAMILY[case])
    row: dict = {"case": case, "what": DESCRIPTION[case], "repo": repo}
    with tempfile.TemporaryDirectory(prefix=f"vs_official_{case}_") as tmp:
        work = Path(tmp)
        row["official_params"] = run_child(args.official_python, args, "official", case, "init", work, repo)["params"]
        row["vlkit_params"] = run_child(sys.executable, args, "vlkit", case, "inputs", work, repo)["params"]
        first = next(iter(variants.values()))
        if args.skip_parity:  # timing only (parity measured by another run: --rounds 0)
            row["parity"] = {"skipped": True}
        else:
            run_child(sys.executable, args, "vlkit", case, "parity", work, repo, first)
            row["parity"] = run_child(args.official_python, args, "official", case, "parity", work, repo)
            print(f"{case}: parity loss diff {row['parity']['loss_diff']:.2e}, max updated-parameter diff "
                  f"{row['parity']['max_param_diff']:.2e} ({row['parity']['params_compared']} tensors)", flush=True)
        if not args.rounds:  # --rounds 0: parity only
            return row
        runs: dict[str, list[dict]] = {"official": [], **{name: [] for name in variants}}
        for r in range(args.rounds):
            order = [("official", None), *variants.items()]
            if r % 2:
                order.reverse()
            for name, options in order:
                side = "official" if name == "official" else "vlkit"
                python = args.official_python if side == "official" else sys.executable
                res = run_child(python, args, side, case, "time", work, repo, options or "")
                runs[name].append(res)
                print(f"  round {r + 1} {name:>12}: {res['step_s']:.3f} s/step, cpu {res['cpu_s']:.3f} s "
                      f"(fwd {res['forward_s']:.3f}, "
                      f"bwd {res['backward_s']:.3f}, opt {res['optimizer_s']:.3f}), peak {res['peak_mb']:.0f} MB",
                      flush=True)
    row["runs"] = runs
    row["official_s"] = statistics.median(x["step_s"] for x in runs["official"])
    row["variants"] = {}
    for name in variants:
        ratios = [o["step_s"] / v["step_s"] for o, v in zip(runs["official"], runs[name])]
        cpu_ratios = [o["cpu_s"] / v["cpu_s"] for o, v in zip(runs["official"], runs[name])]
        row["variants"][name] = {
            "options": json.loads(variants[name] or "{}"),
            "vlkit_s": statistics.median(x["step_s"] for x in runs[name]),
            "ratio": statistics.median(ratios), "ratios": ratios, "cpu_ratio": statistics.median(cpu_ratios),
            "min_ratio": min(o["min_step_s"] for o in runs["official"]) / min(v["min_step_s"] for v in runs[name]),
            "peak_mb": statistics.median(x["peak_mb"] for x in runs[name]),
            "step_mb": statistics.median(x["step_mb"] for x in runs[name]),
            "optimizer_s": statistics.median(x["optimizer_s"] for x in runs[name]),
            **({"bf16_loss_diff": runs[name][0]["bf16_loss_diff"]} if "bf16_loss_diff" in runs[name][0] else {})}
    row["official_peak_mb"] = statistics.median(x["peak_mb"] for x in runs["official"])
    row["official_step_mb"] = statistics.median(x["step_mb"] for x in runs["official"])
    row["official_optimizer_s"] = statistics.median(x["optimizer_s"] for x in runs["official"])
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--official", action="append", default=[], help="checkout path, or family=PATH (repeatable)")
    p.add_argument("--official-python", default=sys.executable, help="interpreter of the official side")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--variant", action="append", default=[],
                   help='vlkit variant NAME=JSON options (default: vlkit={"adamw_rule": "hf", "adamw_impl": "fused"})')
    p.add_argument("--skip-parity", action="store_true", help="timing only (parity: a --rounds 0 run)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="timing rounds (0: parity only)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--text-len", type=int, default=20)
    p.add_argument("--regions", type=int, default=36)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--out", type=Path, default=RESULTS / "vs_official.json")
    # child processes
    p.add_argument("--child", choices=("official", "vlkit"), help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--phase", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--repo", help=argparse.SUPPRESS)
    p.add_argument("--options", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        out = (official_child if args.child == "official" else vlkit_child)(args)
        print(json.dumps(out))
        return
    if not args.official:
        p.error("--official PATH is required (a local checkout of the official code; never committed)")
    variants = dict(v.split("=", 1) for v in args.variant) or {"vlkit": json.dumps(DEFAULT_VARIANT)}
    report = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.platform(),
                       "cpu": _cpu_name(), "threads": args.threads, "batch": args.batch, "text_len": args.text_len,
                       "regions": args.regions, "image_size": args.image_size, "rounds": args.rounds,
                       "steps": args.steps, "optimizer": dict(OPTIM, no_decay=list(NO_DECAY)),
                       "official_python": args.official_python, "command": " ".join(sys.argv)},
              "cases": []}
    for case in args.cases:
        report["cases"].append(run_case(args, case, variants))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    print(f"\n{'case':<12} {'variant':<12} {'official s':>10} {'vlkit s':>8} {'ratio':>6} {'min':>6} {'cpu':>6} "
          f"{'peak MB o/v':>13} {'step MB o/v':>13} {'parity':>9}")
    for row in report["cases"]:
        for name, v in row.get("variants", {}).items():
            print(f"{row['case']:<12} {name:<12} {row['official_s']:>10.3f} {v['vlkit_s']:>8.3f} {v['ratio']:>5.2f}x "
                  f"{v['min_ratio']:>5.2f}x {v['cpu_ratio']:>5.2f}x {row['official_peak_mb']:>6.0f}/"
                  f"{v['peak_mb']:<6.0f} {row['official_step_mb']:>6.0f}/{v['step_mb']:<6.0f} "
                  f"{row['parity'].get('max_param_diff', float('nan')):>9.1e}")
    print(f"\nwrote {args.out}")


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
