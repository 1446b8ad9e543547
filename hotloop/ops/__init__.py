"""Operators in plain torch (CPU and CUDA). Detection: IoU, box coding, NMS,
RoIAlign, anchors and mask pasting; none syncs the host per box. Training:
dropout with ``bits16`` masks (:func:`hotloop.ops.dropout.dropout`)."""
from __future__ import annotations

from .anchors import cell_anchors, grid_anchors, multilevel_anchors
from .boxes import (BoxCoder, box_area, box_cxcywh_to_xyxy, box_iou, box_xyxy_to_cxcywh, clip_boxes,
                    yolo_decode, yolo_encode)
from .dropout import DROPOUT_MASKS, DropoutMaskError, dropout_mask
from .masks import crop_masks, paste_masks
from .nms import batched_nms, batched_nms_mask, nms, nms_mask
from .roi_align import ROI_ALIGN_FORMULATIONS, fpn_levels, multiscale_roi_align, roi_align

__all__ = ["cell_anchors", "grid_anchors", "multilevel_anchors", "BoxCoder", "box_area",
           "box_cxcywh_to_xyxy", "box_iou", "box_xyxy_to_cxcywh", "clip_boxes", "yolo_decode",
           "yolo_encode", "crop_masks", "paste_masks", "batched_nms", "batched_nms_mask", "nms",
           "nms_mask", "fpn_levels", "multiscale_roi_align", "roi_align", "ROI_ALIGN_FORMULATIONS", "DROPOUT_MASKS", "DropoutMaskError",
           "dropout_mask"]
