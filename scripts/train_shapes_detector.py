"""Train the shapes detector that ships in ``vlkit/features/assets`` (the BUTD family on a light trunk).

    python scripts/train_shapes_detector.py                # 30 min on 2 busy CPU cores (600 x 8 scenes)
    python scripts/train_shapes_detector.py --iters 50     # smoke run

Same architecture family as the ResNet-101 BUTD detector (``vlkit.features.detector``, preset
``shapes``): a narrow ResNet-18-like C4 trunk, RPN on C4, RoIPool, a dilated res5 head with mean
pooling (256-d features), a background-first classifier over ``OBJECT_CLASSES``, class-specific box
regression and the class-embedding attribute head over ``ATTRIBUTES``. Scenes come from a training
world (``--train-seed``); mAP@0.5 (own implementation, COCO-style matching, VOC all-point AP) is
measured on held-out scenes of a world with another seed and written into the shipped JSON with the
training settings. The shipped weights are float16 and the reported figures are measured with them.
The run checkpoints every ``--ckpt-every`` iterations and resumes from there when restarted.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from vlkit.data.shapes import ATTRIBUTES, OBJECT_CLASSES, ShapesWorld
from vlkit.features.detector import ASSETS, BottomUpDetector, average_precision, preset, save_detector
from vlkit.features.detector.training import losses as detector_losses
from vlkit.io import atomic_path


def scene_target(scene, flip: bool = False) -> dict[str, np.ndarray]:
    """Ground truth in the detector's inclusive-pixel convention (the scene's boxes end one past)."""
    boxes = np.array([[o.box[0], o.box[1], o.box[2] - 1, o.box[3] - 1] for o in scene.objects], np.float32)
    if flip:
        boxes[:, [0, 2]] = scene.width - 1 - boxes[:, [2, 0]]
    return {
        "boxes": boxes,
        "labels": np.array([o.class_id for o in scene.objects], np.int64),
        "attributes": np.array([o.attribute_ids for o in scene.objects], np.int64),
    }


def evaluate(model: BottomUpDetector, world: ShapesWorld) -> dict:
    """mAP@0.5 of ``detect`` and, on the ground-truth boxes, object and attribute accuracy."""
    model.eval()
    dets, gts, obj_hits, attr_hits, n_obj, n_attr = [], [], 0, 0, 0, 0
    for i in range(len(world)):
        image, target = np.asarray(world.image(i)), scene_target(world.scene(i))
        dets.append(model.detect([image])[0])
        gts.append(target)
        regions = model.extract([image], given_boxes=[target["boxes"]])[0]
        obj_hits += int((regions["cls_prob"].argmax(1) == target["labels"]).sum())
        n_obj += len(target["labels"])
        top = regions["attr_prob"].argsort(1)[:, ::-1][:, : target["attributes"].shape[1]]
        attr_hits += sum(len(set(t) & set(p)) for t, p in zip(target["attributes"].tolist(), top.tolist()))
        n_attr += target["attributes"].size
    aps = average_precision(dets, gts, iou_thresh=0.5)
    return {
        "map50": float(np.mean(list(aps.values()))),
        "ap50_per_class": {OBJECT_CLASSES[c]: round(v, 4) for c, v in aps.items()},
        "gt_box_object_accuracy": obj_hits / max(n_obj, 1),
        "gt_box_attribute_recall_at_k": attr_hits / max(n_attr, 1),
        "eval_images": len(world),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", type=Path, default=ASSETS)
    p.add_argument("--name", default="shapes_detector")
    p.add_argument("--iters", type=int, default=600)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--train-seed", type=int, default=1000)
    p.add_argument("--train-images", type=int, default=20000)
    p.add_argument("--eval-seed", type=int, default=2000)
    p.add_argument("--eval-images", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--ckpt-every", type=int, default=250)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    cfg = preset("shapes", class_names=OBJECT_CLASSES, attribute_names=ATTRIBUTES)
    if (cfg.num_classes, cfg.num_attributes) != (len(OBJECT_CLASSES), len(ATTRIBUTES)):
        raise SystemExit(f"preset 'shapes' has {cfg.num_classes}/{cfg.num_attributes} classes/attributes; "
                         f"the shapes world has {len(OBJECT_CLASSES)}/{len(ATTRIBUTES)}")
    model = BottomUpDetector(cfg)
    decay = [q for n, q in model.named_parameters() if q.ndim > 1]
    no_decay = [q for n, q in model.named_parameters() if q.ndim <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=args.lr, momentum=0.9)
    ckpt = args.out_dir / f".{args.name}.train.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start, rng = state["iter"], np.random.default_rng([args.seed, state["iter"]])
        print(f"resuming from {ckpt} at iteration {start}")

    def lr_at(it: int) -> float:
        if it < args.warmup:
            return args.lr * (0.1 + 0.9 * it / args.warmup)
        return args.lr * 0.5 * (1 + math.cos(math.pi * (it - args.warmup) / max(args.iters - args.warmup, 1)))

    world = ShapesWorld(seed=args.train_seed, num_images=args.train_images)
    model.train()
    t0, running = time.time(), {}
    for it in range(start, args.iters):
        for group in opt.param_groups:
            group["lr"] = lr_at(it)
        images, targets = [], []
        for i in rng.integers(0, len(world), args.batch):
            flip = bool(rng.random() < 0.5)
            img = np.asarray(world.image(int(i)))
            images.append(np.ascontiguousarray(img[:, ::-1]) if flip else img)
            targets.append(scene_target(world.scene(int(i)), flip))
        losses = detector_losses(model, images, targets)
        total = sum(losses.values())
        opt.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
        for k, v in losses.items():
            running[k] = 0.9 * running.get(k, v.item()) + 0.1 * v.item()
        if (it + 1) % 50 == 0 or it + 1 == args.iters:
            print(f"iter {it + 1}/{args.iters} lr {lr_at(it):.4f} {time.time() - t0:.0f}s "
                  + " ".join(f"{k[5:]} {v:.3f}" for k, v in running.items()), flush=True)
        if (it + 1) % args.ckpt_every == 0 and it + 1 < args.iters:
            with atomic_path(ckpt) as tmp:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "iter": it + 1}, tmp)
    train_seconds = time.time() - t0

    with torch.no_grad():  # measure the weights as shipped (float16)
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.half().float())
    metrics = evaluate(model, ShapesWorld(seed=args.eval_seed, num_images=args.eval_images))
    meta = {
        **metrics, "map_method": "own average_precision: COCO-style greedy matching, VOC all-point AP, IoU 0.5",
        "train": {k: v for k, v in vars(args).items() if k not in ("out_dir",)}, "train_seconds": round(train_seconds),
        "torch": torch.__version__,
    }
    path = save_detector(model, args.out_dir, args.name, meta=meta, dtype=torch.float16)
    ckpt.unlink(missing_ok=True)
    print(json.dumps({k: meta[k] for k in ("map50", "ap50_per_class", "gt_box_object_accuracy",
                                             "gt_box_attribute_recall_at_k", "train_seconds")}, indent=1))
    print(f"wrote {path} and {path.with_suffix('.safetensors')}")
    return meta


if __name__ == "__main__":
    main()
