"""The few-rows tower: a bf16 or fp32 question's forward pass in numpy arrays and compiled calls (the model
kernels), with no torch operator between them."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fastdpr.errors import InputError
from fastdpr.models import compiled
from fastdpr.models.fused_linear import FusedLinear
from fastdpr.models.packing import Packed

if TYPE_CHECKING:
    from fastdpr.models.packed_tower import PackedBert


class FewRowsTower:
    """A bf16 or fp32 tower's forward pass for a few rows (a question at query time) in numpy arrays and compiled
    calls: the few-rows linear kernel, the attention kernel and the layer norm of ``fastdpr.models._kernels_C``,
    seven calls per layer and no torch operator, used by :class:`PackedBert` at up to ``compiled.FEW_ROWS`` tokens
    where the few-rows kernel runs (:func:`fastdpr.models.compiled.few_rows_kernel`).

    Why: at a dozen tokens each torch call around the kernels is mostly dispatch (an allocation, a bf16 tensor's
    numpy view, a layer norm: ``benchmarks/micro/test_micro_layer_norm.py``), together a sizeable share of a bf16
    MiniLM question (the whole path against the torch one: ``benchmarks/few_rows_bench.py``). The arithmetic and
    its roundings are those of the torch path through the same kernels: embeddings summed and normalised in fp32
    (then rounded to bf16 once); each layer's sums in fp32 (then rounded once)."""

    def __init__(self, kernel, dtype: torch.dtype, embeddings, emb_norm, layers, heads: int, hidden: int):
        self.kernel, self.dtype = kernel, dtype
        self.embeddings, self.emb_norm, self.layers = embeddings, emb_norm, layers
        self.heads, self.hidden = heads, hidden
        bf16 = dtype == torch.bfloat16
        self.np_dtype = np.uint16 if bf16 else np.float32  # bf16 travels as its bits
        self.linear_fn = kernel.linear_bf16 if bf16 else kernel.linear_f32
        self.attention_fn = kernel.attention_bf16 if bf16 else kernel.attention_f32

    @classmethod
    def build(cls, bert: "PackedBert") -> "FewRowsTower | None":
        """The few-rows forward of ``bert`` after its ``set_precision``, or None where it does not apply (not bf16
        or fp32 on a CPU, no few-rows or attention kernel here, an int8 layer, a head dimension the attention
        kernel does not take)."""
        dtype = bert.compute_dtype
        kernel = compiled.few_rows_kernel(dtype) if dtype in (torch.bfloat16, torch.float32) else None
        if (kernel is None or not hasattr(kernel, "layer_norm") or bert.word.weight.device.type != "cpu"
                or compiled.attention_kernel(dtype) is None or not len(bert.layers)):
            return None
        first = bert.layers[0]
        if (first.hidden // first.heads) % 16:
            return None

        def norm(ln: nn.LayerNorm):
            return (ln.weight.detach().float().numpy(), ln.bias.detach().float().numpy(), float(ln.eps))

        def linear(layer):
            if not isinstance(layer, FusedLinear) or layer.few_rows is None:
                raise LookupError
            packed, bias = layer.few_rows
            return packed, bias, layer.out_features, compiled.FEW_ROWS_ACTIVATIONS[layer.activation]

        try:
            layers = [(linear(lay.qkv), linear(lay.attn_out), norm(lay.ln1), linear(lay.inter), linear(lay.out),
                       norm(lay.ln2)) for lay in bert.layers]
        except LookupError:
            return None
        embeddings = tuple(m.weight.detach().numpy() for m in (bert.word, bert.position, bert.token_type))
        return cls(kernel, dtype, embeddings, norm(bert.emb_ln), layers, first.heads, first.hidden)

    def __call__(self, batch: Packed) -> torch.Tensor:
        x = torch.from_numpy(self.hidden_states(batch.input_ids.numpy(), batch.position_ids.numpy(),
                                                batch.token_type_ids.numpy(), batch.groups))
        return x.view(torch.bfloat16) if self.dtype == torch.bfloat16 else x

    def vector(self, ids: Sequence[int], types: Sequence[int] | None, pooling: str, normalize: bool) -> np.ndarray:
        """(1, hidden) float32: one sequence encoded, pooled (``cls`` or ``mean``) and optionally L2-normalised,
        all in numpy. The same numbers as ``pool_packed`` and ``l2_normalize`` on this tower's output, to fp32
        rounding; the point is the calls it saves: after the weights have streamed through the caches, each torch
        call of packing and pooling a question costs far more than its arithmetic."""
        length = len(ids)
        ids = np.asarray(ids, dtype=np.int64)
        types = np.zeros(length, dtype=np.int64) if types is None else np.asarray(types, dtype=np.int64)
        h = self.hidden_states(ids, np.arange(length, dtype=np.int64), types, [(1, length)])
        if self.dtype == torch.bfloat16:
            h = (h.astype(np.uint32) << 16).view(np.float32)
        v = h[:1].copy() if pooling == "cls" else h.mean(axis=0, dtype=np.float32, keepdims=True)
        if normalize:
            v /= max(float(np.sqrt(np.dot(v[0], v[0]))), 1e-12)  # F.normalize's eps
        return v

    def hidden_states(self, ids: np.ndarray, positions: np.ndarray, types: np.ndarray,
                      groups: list[tuple[int, int]]) -> np.ndarray:
        """(tokens, hidden) last hidden states, float32 or bf16 bits (uint16)."""
        k, tokens = self.kernel, len(ids)
        word, position, token_type = self.embeddings
        # numpy indexing wraps negative ids around where torch's embedding raises: never a silent wrong vector
        for values, table, what in ((ids, word, "token id"), (types, token_type, "token type id")):
            if tokens and (values.min() < 0 or values.max() >= len(table)):
                bad = values[(values < 0) | (values >= len(table))][0]
                raise InputError(f"{what} {int(bad)} is out of range: the model has {len(table)}")
        e = word[ids]
        e += position[positions]
        e += token_type[types]
        x = np.empty((tokens, self.hidden), dtype=self.np_dtype)
        k.layer_norm(e, *self.emb_norm, x)
        groups = np.asarray(groups, dtype=np.int64).reshape(-1, 2)
        threads = torch.get_num_threads()

        def linear(spec, inp, residual=None):
            packed, bias, width, activation = spec
            out = np.empty((tokens, width), dtype=self.np_dtype)
            self.linear_fn(inp, packed, width, bias, activation, residual, out, "", threads)
            return out

        for qkv, attn_out, ln1, inter, out, ln2 in self.layers:
            ctx = np.empty((tokens, self.hidden), dtype=self.np_dtype)
            self.attention_fn(linear(qkv, x), ctx, groups, self.heads, "", threads)
            y = linear(attn_out, ctx, residual=x)
            k.layer_norm(y, *ln1, y)
            x = linear(out, linear(inter, y), residual=y)
            k.layer_norm(x, *ln2, x)
        return x
