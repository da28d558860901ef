"""Bottom-up-attention Faster R-CNN (Anderson et al. 2018, §3.1) on torchvision ops, no detectron2.

One implementation, two presets:

* ``butd_r101``: the Caffe Visual Genome detector. ResNet-101 C4 with the Caffe stem (max-pool pad 0,
  ceil), RPN on res4 (512 channels, 12 anchors 64-512 px, NMS 0.7, 6000 -> 300 proposals), RoIPool
  14x14, res5 with stride 1 and dilation 2, mean-pooled 2048-d features, 1601-way classifier
  (background first), class-specific box regression, attribute head (256-d embedding of the argmax
  class, 512 hidden, 401 attributes). Input BGR minus the Caffe means, shorter side 600, longer <= 1000.
* ``shapes``: a narrow ResNet-18-like C4 trunk of the same family trained on the shapes world
  (``scripts/train_shapes_detector.py``); its weights ship in ``vlkit/features/assets``.

Box conventions follow py-faster-rcnn (inclusive pixel boxes: width = x2 - x1 + 1, anchors centred at
``(stride - 1) / 2``); the legacy ``+1`` IoU of the Caffe NMS is obtained with ``torchvision.ops.nms``
on boxes whose far corner is moved by one pixel.

``extract`` applies the BUTD selection rule (``generate_tsv.py``): boxes are the proposals, a box's
``max_conf`` is its best class score over the classes 1.. for which it survives per-class NMS 0.3, keep
``max_conf >= 0.2`` and clamp the count to [10, 100] (or fixed 36). Rows come back sorted by
descending ``max_conf``. ``detect`` is standard Fast R-CNN inference (regressed boxes), used for mAP.

Modules: `boxes` (anchors, box coding, NMS, the BUTD selection rule), `network` (config, presets, the
detector and its inference), `training` (Faster R-CNN losses), `evaluation` (AP), `weights` (save /
load, the shipped shapes detector), `convert` (the released BUTD checkpoints) and `extraction` (images
-> an h5 feature store).
"""
from vlkit.features.detector.boxes import (butd_select, cell_anchors, class_nms, clip_boxes, decode_boxes,
                                           encode_boxes, grid_anchors, legacy_nms)
from vlkit.features.detector.evaluation import average_precision
from vlkit.features.detector.extraction import extract_features
from vlkit.features.detector.network import (CAFFE_PIXEL_MEAN_BGR, PRESETS, Backbone, BottomUpDetector, BoxPredictor,
                                             DetectorConfig, Prepared, RoIHeads, RPN, RPNHead, Stem, preset)
from vlkit.features.detector.weights import ASSETS, load_detector, save_detector

__all__ = ["ASSETS", "Backbone", "BottomUpDetector", "BoxPredictor", "CAFFE_PIXEL_MEAN_BGR", "DetectorConfig", "PRESETS",
           "Prepared", "RPN", "RPNHead", "RoIHeads", "Stem", "average_precision", "butd_select", "cell_anchors",
           "class_nms", "clip_boxes", "decode_boxes", "encode_boxes", "extract_features", "grid_anchors",
           "legacy_nms", "load_detector", "preset", "save_detector"]
