"""Inference-only towers: the fastest way this machine has to turn token lists into vectors.

Encoding needs no gradients, no dropout and no padding, so it gets its own forward pass:

- **packed rows**: the tokens of a batch are concatenated into one ``(tokens, hidden)`` matrix, so every linear
  layer (most of the work) costs the batch's real tokens, not ``batch × longest``; attention runs per group of
  equal-length sequences (a length-sorted batch has few), exact and without a mask;
- **weights in the compute precision** (``bf16``/``fp16``) rather than autocast, which would re-cast every weight
  on every call, and ``int8`` through dynamic quantization of the linear layers (VNNI / AMX on x86);
- one fused query-key-value projection per layer (one large matrix product instead of three);
- on CPUs, linear layers run through oneDNN with **pre-packed weights** (re-laid-out once for the matrix unit,
  AMX/AVX-512, instead of on every call) and their **epilogue fused**: bias + GELU for the feed-forward input, bias
  + residual add for the two output projections, so the largest activations are written once instead of three
  times. Where oneDNN is missing (other CPUs' builds, CUDA, fp16 on CPU) the same layers run as
  ``F.linear`` + activation + add, with the same answers;
- on CPUs with AVX-512 but no AMX, a bf16 or fp32 question (at most ``compiled.FEW_ROWS`` tokens) runs through compiled
  calls on numpy arrays (:class:`FewRowsTower`: fastdpr's few-rows linear layer, attention and layer norm), with no
  torch operator between them.

BERT-family encoders (BERT, MiniLM, DPR's towers) take the packed path; any other encoder runs padded through its
own ``transformers`` forward in the same precision. A tower is built once per (tower, precision, device) and
rebuilt when the model's weights change (an optimizer step, ``load_state_dict`` or ``.to()``).

Example::

    tower = build_tower(model.question_encoder, "int8", torch.device("cpu"))
    hidden, groups = tower(pack([(ids, None) for ids in token_lists], pad_id=0, device="cpu"))
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn

from fastdpr.models.fused_linear import FusedLinear, onednn_linear_available
from fastdpr.models.int8 import Int8Linear, onednn_int8_available, quantize_linears
from fastdpr.models.packed_tower import PackedBert, cpu_token_budget, supports_packing
from fastdpr.models.few_rows_tower import FewRowsTower
from fastdpr.models.packing import Packed, pack
from fastdpr.models.padded_tower import PaddedTower
from fastdpr.models.pooling import pool_packed
from fastdpr.models.precision import ALIASES, DTYPES, PRECISIONS, bf16_supported, resolve_precision

log = logging.getLogger("fastdpr.models")


def build_tower(encoder: nn.Module, precision: str, device: torch.device, pad_id: int) -> nn.Module:
    with torch.no_grad():
        if supports_packing(encoder):
            tower = PackedBert(encoder)
        else:
            log.info("%s encoders run padded (the packed path reads BERT-family encoders)",
                     getattr(encoder.config, "model_type", type(encoder).__name__))
            tower = PaddedTower(encoder, pad_id)
        tower = tower.to(device).set_precision(precision)
    return tower.eval().requires_grad_(False)


def weights_state(module: nn.Module | Sequence[torch.Tensor]) -> tuple:
    """Changes whenever a weight is modified in place (optimizer step, load_state_dict) or replaced (``.to()``).
    Takes a module or its parameter list (listing a module's parameters costs more than the check itself)."""
    params = list(module.parameters()) if isinstance(module, nn.Module) else module
    return (len(params), sum(p._version for p in params), sum(p.data_ptr() for p in params))


__all__ = ["PRECISIONS", "ALIASES", "DTYPES", "resolve_precision", "bf16_supported", "Packed", "pack", "PackedBert",
           "PaddedTower", "FewRowsTower", "FusedLinear", "Int8Linear", "onednn_linear_available",
           "onednn_int8_available", "quantize_linears", "pool_packed", "cpu_token_budget", "build_tower",
           "supports_packing", "weights_state"]
