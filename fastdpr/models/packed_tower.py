"""The packed tower of BERT-family encoders: every linear layer over the batch's real tokens only (one row of
packed tokens), attention per group of equal-length sequences (through the attention kernel on CPUs that run it)
or through padding on a GPU, weights in the compute precision or int8."""
from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fastdpr.models import compiled
from fastdpr.models.few_rows_tower import FewRowsTower
from fastdpr.models.fused_linear import ACTIVATIONS, FusedLinear
from fastdpr.models.int8 import Int8Linear, onednn_int8_available
from fastdpr.models.packing import Packed
from fastdpr.models.precision import DTYPES, bf16_supported


def supports_packing(encoder: nn.Module) -> bool:
    """BERT-family encoders with absolute positions and a known activation (the layout :class:`PackedBert`
    reads); everything else runs through its own forward, padded."""
    config = getattr(encoder, "config", None)
    return (config is not None and getattr(config, "model_type", None) == "bert"
            and getattr(config, "position_embedding_type", "absolute") == "absolute"
            and getattr(config, "hidden_act", None) in ACTIVATIONS
            and not getattr(config, "is_decoder", False)
            and hasattr(encoder, "embeddings") and hasattr(encoder, "encoder"))


class _PackedLayer(nn.Module):
    def __init__(self, layer, heads: int, eps: float, act: str):
        super().__init__()
        attn = layer.attention.self
        hidden = attn.query.in_features
        with torch.no_grad():
            self.qkv = FusedLinear(torch.cat([attn.query.weight, attn.key.weight, attn.value.weight]),
                                   torch.cat([attn.query.bias, attn.key.bias, attn.value.bias]))
        self.attn_out = FusedLinear.from_linear(layer.attention.output.dense)  # + residual
        self.ln1 = copy.deepcopy(layer.attention.output.LayerNorm)
        self.inter = FusedLinear.from_linear(layer.intermediate.dense, activation=act)
        self.out = FusedLinear.from_linear(layer.output.dense)  # + residual
        self.ln2 = copy.deepcopy(layer.output.LayerNorm)
        self.heads, self.hidden, self.eps = heads, hidden, eps

    def forward(self, x: torch.Tensor, batch: Packed) -> torch.Tensor:
        qkv = self.qkv(x)
        ctx = self._attention_padded(qkv, batch) if batch.seq_index is not None else \
            self._attention_grouped(qkv, batch.groups)
        x = self.ln1(self.attn_out(ctx, residual=x))
        return self.ln2(self.out(self.inter(x), residual=x))

    def _attention_padded(self, qkv: torch.Tensor, batch: Packed) -> torch.Tensor:
        """Attention through a padded (B, longest) layout with a key mask: a few kernels per layer whatever the
        lengths (on a GPU one launch per length group would cost more than the arithmetic); the linear layers
        around it stay packed."""
        heads, head_dim = self.heads, self.hidden // self.heads
        n, longest = batch.key_mask.shape[0], batch.key_mask.shape[-1]
        padded = qkv.new_zeros(n, longest, 3 * self.hidden)
        padded[batch.seq_index, batch.position_ids] = qkv
        q, k, v = padded.view(n, longest, 3, heads, head_dim).unbind(2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=batch.key_mask)
        return o.transpose(1, 2)[batch.seq_index, batch.position_ids].reshape(-1, self.hidden)

    def _attention_grouped(self, qkv: torch.Tensor, groups: list[tuple[int, int]]) -> torch.Tensor:
        """Exact attention per group of equal-length sequences, no mask and no padding (the CPU path: a
        length-sorted batch has few groups, and each costs only its own tokens). On CPUs with AVX-512 bf16 and fp32
        go through the compiled kernel (csrc/attention.h: AMX or AVX512-BF16 for bf16, AVX-512F for fp32; faster than
        torch's CPU flash attention at head dimension 32: benchmarks/micro/test_micro_attention.py measures both),
        everything else through ``scaled_dot_product_attention``."""
        heads, head_dim = self.heads, self.hidden // self.heads
        kernel = compiled.attention_kernel(qkv.dtype) if qkv.device.type == "cpu" and head_dim % 16 == 0 else None
        if kernel is not None:
            qkv = qkv.contiguous()
            out = torch.empty(qkv.shape[0], self.hidden, dtype=qkv.dtype)
            pairs = np.asarray(groups, dtype=np.int64).reshape(-1, 2)
            if qkv.dtype == torch.bfloat16:
                kernel.attention_bf16(compiled.bits(qkv), compiled.bits(out), pairs, heads, "", torch.get_num_threads())
            else:
                kernel.attention_f32(qkv.numpy(), out.numpy(), pairs, heads, "", torch.get_num_threads())
            return out
        ctx = torch.empty(qkv.shape[0], self.hidden, dtype=qkv.dtype, device=qkv.device) if len(groups) > 1 else None
        start = 0
        for n, length in groups:
            rows = n * length
            g = qkv[start:start + rows].view(n, length, 3, heads, head_dim)
            q, k, v = (g[:, :, i].transpose(1, 2) for i in range(3))
            o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(rows, self.hidden)
            if ctx is None:
                ctx = o
            else:
                ctx[start:start + rows] = o
            start += rows
        return ctx


class PackedBert(nn.Module):
    """A BERT encoder's weights re-laid-out for packed inference; ``forward`` gives ``(tokens, hidden)`` states
    equal to the padded ``transformers`` forward at the real tokens (float32: to rounding)."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        cfg = encoder.config
        emb = encoder.embeddings
        # embeddings and their LayerNorm stay float32 in every precision: a lookup costs nothing, and summing three
        # tables in bf16 would lose digits before the first layer
        self.word = copy.deepcopy(emb.word_embeddings)
        self.position = copy.deepcopy(emb.position_embeddings)
        self.token_type = copy.deepcopy(emb.token_type_embeddings)
        self.emb_ln = copy.deepcopy(emb.LayerNorm)
        self.layers = nn.ModuleList(_PackedLayer(layer, cfg.num_attention_heads, cfg.layer_norm_eps, cfg.hidden_act)
                                    for layer in encoder.encoder.layer)
        self.compute_dtype = torch.float32
        self.token_budget: int | None = None
        self.few_rows: FewRowsTower | None = None

    def set_precision(self, precision: str) -> "PackedBert":
        for m in (self.word, self.position, self.token_type, self.emb_ln):
            m.float()
        if precision in ("bf16", "fp16"):
            self.layers.to(DTYPES[precision])
            self.compute_dtype = DTYPES[precision]
        elif precision == "int8":
            # The feed-forward output layer stays in floating point: its input (after GELU) has outlier features
            # that one 8-bit scale per call clips; quantizing it too lowers MiniLM's minimum cosine from 0.995 to
            # 0.990 on SQuAD passages. Where the CPU computes bf16 natively (AMX / AVX512-BF16) everything that is
            # not int8 runs in bf16 as in the bf16 tower (activations, attention, that layer): in fp32 it was a
            # large share of the int8 tower's time.
            activations = torch.bfloat16 if onednn_int8_available() and bf16_supported() else torch.float32
            for layer in self.layers:
                for name in ("qkv", "attn_out", "inter"):
                    setattr(layer, name, Int8Linear(getattr(layer, name), out_dtype=activations))
            if activations == torch.bfloat16:
                self.layers.to(torch.bfloat16)
                self.compute_dtype = torch.bfloat16
        for module in self.layers.modules():
            if isinstance(module, FusedLinear):
                module.prepack()
        self.token_budget = cpu_token_budget(self.layers[0], self.compute_dtype) \
            if self.word.weight.device.type == "cpu" and len(self.layers) else None
        self.few_rows = FewRowsTower.build(self)
        return self

    def forward(self, batch: Packed) -> torch.Tensor:
        if self.few_rows is not None and batch.seq_index is None and len(batch.input_ids) <= compiled.FEW_ROWS:
            return self.few_rows(batch)
        x = self.word(batch.input_ids) + self.position(batch.position_ids) + self.token_type(batch.token_type_ids)
        x = self.emb_ln(x).to(self.compute_dtype)
        for layer in self.layers:
            x = layer(x, batch)
        return x

    def one_vector(self, seq: tuple[Sequence[int], Sequence[int] | None], pooling: str,
                   normalize: bool) -> np.ndarray | None:
        """(1, hidden) float32 pooled vector of one sequence through the few-rows forward pass in numpy
        (:meth:`FewRowsTower.vector`), or None where it does not apply (then pack and call the tower)."""
        if self.few_rows is None or len(seq[0]) > compiled.FEW_ROWS:
            return None
        return self.few_rows.vector(seq[0], seq[1], pooling, normalize)

    def _apply(self, fn, recurse=True):
        self.few_rows = None  # its arrays are views of the old weights
        return super()._apply(fn, recurse)


# The largest activation of one forward pass on a CPU, in bytes (see cpu_token_budget).
_CPU_ACTIVATION_BYTES = 12 << 20


def cpu_token_budget(layer: "_PackedLayer", dtype: torch.dtype) -> int:
    """Tokens per forward pass on a CPU: as many as keep the largest activation (the query-key-value or
    feed-forward output) under 12 MiB, 2,048 for MiniLM in fp32, 1,024 for BERT-base.

    Why: glibc's malloc serves blocks below its mmap threshold (which adapts up to 32 MiB) from a heap it
    reuses, but maps every larger block fresh, so each call faults in and zeroes its pages again, a visible share
    of fp32 encoding. Smaller passes also keep each layer's activations in cache, and matrix products keep their
    speed at a few thousand rows."""
    widest = max(layer.qkv.out_features, layer.inter.out_features)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return max(1, _CPU_ACTIVATION_BYTES // (widest * itemsize))
