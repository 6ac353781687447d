"""Self-attention for training on CPUs under bf16/fp16 autocast.

Under autocast the q/k/v projections hand ``scaled_dot_product_attention`` bf16 tensors, and torch's CPU
flash-attention *backward* is much slower in bf16 than in fp32 at the head dimensions of small encoders (head
dimension 32, 12 heads, one core, torch 2.13, forward + backward): 24 rows × 160 tokens 120 ms in bf16 against
56 ms in fp32, 128 × 32 tokens 110 against 32 ms, 32 × 256 tokens 197 against 161 ms, 8 × 512 equal. A reader
training step spent 43% of its time there.

``fp32_cpu_attention`` is transformers' SDPA attention with that one change: on a CPU, while gradients are
recorded and the inputs are half precision, the attention runs in fp32 (autocast off inside it) and its output
goes back to the input dtype. Anywhere else (inference, GPUs, fp32 inputs) it is transformers' SDPA unchanged.
:func:`use_fp32_cpu_attention` switches a model to it; the switch is not saved with the model's config.
"""
from __future__ import annotations

import torch

NAME = "fastdpr_fp32_cpu_sdpa"
_HALF = (torch.bfloat16, torch.float16)


def fp32_cpu_attention(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.device.type != "cpu" or query.dtype not in _HALF or not torch.is_grad_enabled():
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    dtype = query.dtype
    if attention_mask is not None and attention_mask.dtype in _HALF:
        attention_mask = attention_mask.float()
    with torch.autocast("cpu", enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                              **kwargs)
    return out.to(dtype), weights


def _register() -> None:
    from transformers import AttentionInterface

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, fp32_cpu_attention)


def use_fp32_cpu_attention(model: torch.nn.Module) -> int:
    """Switch every transformers model inside ``model`` that uses SDPA attention to :func:`fp32_cpu_attention`;
    return how many configs were switched. Models on eager or flash-attention implementations are left alone."""
    from transformers import PreTrainedModel

    _register()
    switched = 0
    seen = set()
    for sub in model.modules():
        config = getattr(sub, "config", None) if isinstance(sub, PreTrainedModel) else None
        if config is None or id(config) in seen:
            continue
        seen.add(id(config))
        if getattr(config, "_attn_implementation", None) == "sdpa":
            config._attn_implementation = NAME
            switched += 1
    return switched
