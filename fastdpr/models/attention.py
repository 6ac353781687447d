"""Self-attention for training on CPUs: dropout on the attention probabilities without torch's per-element
random draws, and fp32 attention under bf16/fp16 autocast.

Dropout. With a dropout probability above 0 torch's CPU attention cannot use its fused kernel and runs unfused,
drawing one Mersenne-twister number per attention probability under the generator's lock: in a small encoder's
training step (MiniLM, head dimension 32) those draws took longer than the attention products themselves.
:class:`SeededDropoutAttention` instead draws one 64-bit seed from torch's CPU generator per call and derives the
mask from (seed, element index) with a counter-based hash (``csrc/dropout.h``; :func:`dropout_reference` is the
same function in torch, used where the kernels are not built). The draw keeps the generator's bookkeeping: code that
saves and restores the generator state (GradCache's replay, activation checkpointing) gets the same masks again.
Nothing of size L×L is saved for the backward pass: it recomputes the probabilities and the mask from q, k, v and
the seed, so a training chunk holds q, k and v per layer instead of the probabilities, the mask and the dropped
probabilities. The masks are other draws than torch's, with the same keep probability (to 2^-32) and scale.

Precision. Under autocast the q/k/v projections hand ``scaled_dot_product_attention`` bf16 tensors, and torch's CPU
flash-attention *backward* is slower in bf16 than in fp32 at the head dimensions of small encoders (32), where a
reader training step spends much of its time. So on a CPU, while gradients are recorded or dropout is on, the
attention runs in fp32 (autocast off inside it) and its output goes back to the input dtype.

``cpu_training_attention`` is transformers' SDPA attention with those two changes; anywhere else (inference, GPUs,
fp32 inputs without dropout) it is transformers' SDPA unchanged. :func:`use_cpu_training_attention` switches a
model to it; the switch is not saved with the model's config.
"""
from __future__ import annotations

import torch

NAME = "fastdpr_cpu_training_sdpa"
_HALF = (torch.bfloat16, torch.float16)

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


# ------------------------------------------------------------------------------------------------ seeded dropout

def _int64(value: int) -> int:
    """A 64-bit pattern as the signed int64 torch stores."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 patterns (torch's >> on int64 is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def keep_threshold(keep_prob: float) -> int:
    """Lanes below this keep their element (csrc/dropout.h ``threshold``)."""
    if not keep_prob > 0.0:
        return 0
    if keep_prob >= 1.0:
        return 1 << 32
    return int(round(keep_prob * 4294967296.0))


def dropout_reference(x: torch.Tensor, keep_prob: float, seed: int, scale: float) -> torch.Tensor:
    """``x`` times ``scale`` where kept, else 0, with csrc/dropout.h's mask (a new tensor, in x's dtype)."""
    n = x.numel()
    pairs = torch.arange(1, (n + 1) // 2 + 1, dtype=torch.int64)
    z = pairs * _int64(_GOLDEN) + _int64(seed)  # int64 arithmetic wraps like the kernel's uint64
    z = (z ^ _shift_right(z, 30)) * _int64(_MIX1)
    z = (z ^ _shift_right(z, 27)) * _int64(_MIX2)
    z = z ^ _shift_right(z, 31)
    lanes = torch.stack([z & 0xFFFFFFFF, _shift_right(z, 32)], dim=1).reshape(-1)[:n]
    keep = (lanes < keep_threshold(keep_prob)).reshape(x.shape)
    return torch.where(keep, x * scale, torch.zeros((), dtype=x.dtype))


def seeded_dropout_(x: torch.Tensor, keep_prob: float, seed: int, scale: float) -> torch.Tensor:
    """:func:`dropout_reference` in place on a contiguous float32 CPU tensor, by the compiled kernel when built."""
    from fastdpr.models.compiled import kernels

    kernel = getattr(kernels(), "dropout_", None)
    if kernel is None or x.dtype != torch.float32 or not x.is_contiguous() or x.device.type != "cpu":
        return x.copy_(dropout_reference(x, keep_prob, seed, scale))
    kernel(x.detach().numpy(), keep_prob, seed, scale)
    return x


def _dropped_copy(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    # half-precision tensors are masked in a float32 copy: one rounding back, as x * mask * scale would make
    work = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32, memory_format=torch.contiguous_format,
                copy=True)
    return seeded_dropout_(work, 1.0 - p, seed, 1.0 / (1.0 - p)).to(x.dtype)


class _SeededDropoutFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p, seed):
        ctx.p, ctx.seed = p, seed
        return _dropped_copy(x, p, seed)

    @staticmethod
    def backward(ctx, grad):
        return _dropped_copy(grad, ctx.p, ctx.seed), None, None


class SeededDropout(torch.nn.Dropout):
    """``nn.Dropout`` with the seeded mask (one draw from torch's CPU generator per call; nothing saved for the
    backward pass but the seed) on CPU tensors; elsewhere ``nn.Dropout`` itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or self.p >= 1.0:
            return super().forward(x)
        seed = int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64))
        return _SeededDropoutFunction.apply(x, self.p, seed)


def _probabilities(q, k, mask, scaling):
    scores = torch.matmul(q * scaling, k.transpose(-1, -2))
    if mask is not None:
        scores.add_(mask)
    return torch.softmax(scores, dim=-1)


# Scores of this many elements (512 KiB in fp32) stay in a core's L2 cache between the products, the softmax and the
# mask; the whole (B, H, L, L) scores of a training chunk (32 × 12 × 128², 25 MB) would go to memory and back
# between each of those steps.
_BLOCK_ELEMENTS = 1 << 17


def _blocks(q: torch.Tensor, k: torch.Tensor, seed: int):
    """(rows, seed) pairs that cover dim 0 of the scores in blocks of about ``_BLOCK_ELEMENTS``.

    A block's seed starts its mask where the whole tensor's mask is at the block's first element: the mask of
    element i depends on the pair i // 2 as ``SplitMix64(seed + (i // 2 + 1)·φ)``, so a block starting at an even
    element e draws from ``seed + (e / 2)·φ`` exactly what the unblocked call draws from ``seed`` (blocks hold an
    even number of elements, all but maybe the last)."""
    per_row = k.shape[-2]
    for size in q.shape[1:-1]:
        per_row *= size
    rows = max(1, _BLOCK_ELEMENTS // max(per_row, 1))
    rows += (rows * per_row) % 2
    for start in range(0, q.shape[0], rows):
        yield slice(start, start + rows), _int64(seed + (start * per_row // 2) * _GOLDEN)


def _mask_rows(mask: torch.Tensor | None, rows: slice, batch: int) -> torch.Tensor | None:
    if mask is None or mask.dim() < 4 or mask.shape[0] != batch:
        return mask  # broadcast over the batch
    return mask[rows]


class SeededDropoutAttention(torch.autograd.Function):
    """``dropout(softmax(scaling·q kᵀ + mask)) v`` with the seeded mask; saves q, k, v and the seed only.

    q, k, v are float32 (float64 stays float64, for gradient checks), (B, H, L, D); ``mask`` is additive,
    broadcastable to the scores, in their dtype, or None. Both passes run a few batch rows at a time
    (:data:`_BLOCK_ELEMENTS`), with the same mask as in one piece."""

    @staticmethod
    def forward(ctx, q, k, v, mask, p, scaling, seed):
        keep, scale = 1.0 - p, 1.0 / (1.0 - p)
        out = q.new_empty(q.shape[:-1] + v.shape[-1:])
        for rows, block_seed in _blocks(q, k, seed):
            probs = _probabilities(q[rows], k[rows], _mask_rows(mask, rows, q.shape[0]), scaling)
            seeded_dropout_(probs, keep, block_seed, scale)
            torch.matmul(probs, v[rows], out=out[rows])
        ctx.save_for_backward(q, k, v, mask)
        ctx.p, ctx.scaling, ctx.seed = p, scaling, seed
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, mask = ctx.saved_tensors
        keep, scale = 1.0 - ctx.p, 1.0 / (1.0 - ctx.p)
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        with torch.autocast("cpu", enabled=False):
            grad_out = grad_out.to(q.dtype)
            for rows, block_seed in _blocks(q, k, ctx.seed):
                qb, kb, vb, gb = q[rows], k[rows], v[rows], grad_out[rows]
                probs = _probabilities(qb, kb, _mask_rows(mask, rows, q.shape[0]), ctx.scaling)
                dropped = seeded_dropout_(probs.clone(), keep, block_seed, scale)
                torch.matmul(dropped.transpose(-1, -2), gb, out=grad_v[rows])
                del dropped
                grad_probs = seeded_dropout_(torch.matmul(gb, vb.transpose(-1, -2)), keep, block_seed, scale)
                # softmax backward: dS = P ∘ (dP − rowsum(dP ∘ P))
                row = (grad_probs * probs).sum(dim=-1, keepdim=True)
                grad_scores = grad_probs.sub_(row).mul_(probs)
                del probs
                torch.matmul(grad_scores, kb, out=grad_q[rows]).mul_(ctx.scaling)
                torch.matmul(grad_scores.transpose(-1, -2), qb, out=grad_k[rows]).mul_(ctx.scaling)
        return grad_q, grad_k, grad_v, None, None, None, None


def _additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        # transformers' eager attention uses the dtype's minimum, not -inf: a row with no key stays finite
        return torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)
    return mask.to(dtype)


def seeded_dropout_attention(query, key, value, attention_mask, dropout: float, scaling: float | None):
    """(B, Lq, H, D) attention output (transformers' layout) with seeded dropout, computed in fp32 (float64 inputs
    in float64)."""
    dtype = query.dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    scaling = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    # one draw from torch's CPU generator: saving and restoring its state replays the mask
    seed = int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64))
    with torch.autocast("cpu", enabled=False):
        # transformers hands (B, H, L, D) views of (B, L, H·D) projections: one contiguous copy here spares every
        # product below its own
        q, k, v = (t.to(work, memory_format=torch.contiguous_format) for t in (query, key, value))
        out = SeededDropoutAttention.apply(q, k, v, _additive_mask(attention_mask, work), float(dropout), scaling,
                                           seed)
    return out.transpose(1, 2).contiguous().to(dtype)


# ---------------------------------------------------------------------------------------------- the interface

def cpu_training_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                           **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    on_cpu = query.device.type == "cpu"
    if (on_cpu and dropout > 0.0 and kwargs.get("position_bias") is None
            and query.shape[1] == key.shape[1] and not getattr(module, "is_causal", False)):
        return seeded_dropout_attention(query, key, value, attention_mask, dropout, scaling), None
    if not on_cpu or query.dtype not in _HALF or not torch.is_grad_enabled():
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    dtype = query.dtype
    if attention_mask is not None and attention_mask.dtype in _HALF:
        attention_mask = attention_mask.float()
    with torch.autocast("cpu", enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                              dropout=dropout, scaling=scaling, **kwargs)
    return out.to(dtype), weights


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, cpu_training_attention)
    # transformers builds the padding mask by the implementation's name: without SDPA's mask builder registered
    # under this name too, the model would get no padding mask and attend to padding tokens
    if NAME not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping["sdpa"])


def use_seeded_dropout(model: torch.nn.Module) -> int:
    """Replace every ``nn.Dropout`` inside ``model`` by a :class:`SeededDropout` of the same probability; return how
    many were replaced. Dropout has no weights, so checkpoints are unchanged."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Dropout:
                setattr(parent, name, SeededDropout(child.p))
                replaced += 1
    return replaced


def use_cpu_training_attention(model: torch.nn.Module) -> int:
    """Switch every transformers model inside ``model`` that uses SDPA attention to :func:`cpu_training_attention`;
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
