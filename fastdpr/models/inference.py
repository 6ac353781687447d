"""Inference-only towers: the fastest way this machine has to turn token lists into vectors.

Encoding needs no gradients, no dropout and no padding, so it gets its own forward pass:

- **packed rows**: the tokens of a batch are concatenated into one ``(tokens, hidden)`` matrix, so every linear
  layer (≈95% of the work) costs the batch's real tokens, not ``batch × longest``; attention runs per group of
  equal-length sequences (a length-sorted batch has few), exact and without a mask;
- **weights in the compute precision** (``bf16``/``fp16``) rather than autocast, which would re-cast every weight
  on every call, and ``int8`` through dynamic quantization of the linear layers (VNNI / AMX on x86);
- one fused query-key-value projection per layer (one large matrix product instead of three);
- on CPUs, linear layers run through oneDNN with **pre-packed weights** (re-laid-out once for the matrix unit,
  AMX/AVX-512, instead of on every call) and their **epilogue fused**: bias + GELU for the feed-forward input, bias
  + residual add for the two output projections, so the largest activations are written once instead of three
  times. Where oneDNN is missing (other CPUs' builds, CUDA, fp16 on CPU) the same layers run as
  ``F.linear`` + activation + add, with the same answers;
- on CPUs with AVX-512 but no AMX, a bf16 or fp32 question (at most ``_FEW_ROWS`` tokens) runs through compiled
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

import copy
import functools
import itertools
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fastdpr.errors import InputError

log = logging.getLogger("fastdpr.models")

# canonical names (the same as `fastdpr train --precision`) and the long names kept as aliases
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.float32}

_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}
# the same activations as oneDNN post-ops: (attr, algorithm) of torch.ops.mkldnn._linear_pointwise
_ONEDNN_ACTIVATIONS = {
    None: ("none", ""),
    "gelu": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
}
# the same activations in the few-rows kernel (csrc/few_rows_linear.h)
_FEW_ROWS_ACTIVATIONS = {None: "", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                         "relu": "relu"}
# rows of a typical batch; oneDNN picks the packed layout for it, and the layout stays correct for any row count
# (measured on a 384→1536 layer: a hint of 4,096 is as fast as the exact row count at 12 and at 4,300 rows)
_PACK_ROWS_HINT = 4096
# products of at most this many rows (a question, a small batch) go through fastdpr's few-rows kernel where it runs
# (csrc/few_rows_linear.h); above it oneDNN is as fast (benchmarks/results/few_rows.md: MiniLM's layers in a 6-layer
# weight rotation on an AMD EPYC, bf16 and fp32, the gain shrinking to a few percent at 64 rows)
_FEW_ROWS = 64


def resolve_precision(precision: str, device: torch.device) -> str:
    """A canonical precision name; ``auto`` is fp16 on CUDA and fp32 elsewhere."""
    name = ALIASES.get(precision, precision)
    if name not in PRECISIONS:
        raise InputError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)} "
                         f"(or {', '.join(ALIASES)})")
    if name == "auto":
        name = "fp16" if device.type == "cuda" else "fp32"
    if name == "int8" and device.type != "cpu":
        raise InputError("precision int8 runs on the CPU only (dynamic quantization); use fp16 or bf16 on "
                         f"{device.type}")
    return name


def bf16_supported(device: str | torch.device = "cpu") -> bool:
    """Whether bfloat16 matrix products run natively here, so bf16 (weights or autocast) is faster than float32: a
    CUDA device that supports it, or a CPU with AVX512-BF16/AMX (oneDNN's check). Elsewhere bf16 is emulated and
    slower than float32."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


# ---------------------------------------------------------------------------------------------------- packing
@dataclass
class Packed:
    """A batch as one row of tokens: sequences in ``groups`` order, each group ``(count, length)`` of equal
    lengths, contiguous."""

    input_ids: torch.Tensor  # (T,)
    token_type_ids: torch.Tensor  # (T,)
    position_ids: torch.Tensor  # (T,)
    groups: list[tuple[int, int]]
    seq_index: torch.Tensor | None = None  # (T,) the sequence of each token (for attention through padding)
    key_mask: torch.Tensor | None = None  # (B, 1, 1, longest) True at real tokens

    @property
    def count(self) -> int:
        return sum(n for n, _ in self.groups)


def pack(seqs: Sequence[tuple[list[int], list[int] | None]], device: torch.device,
         padded_attention: bool | None = None) -> Packed:
    """Pack sequences that are already sorted by length (equal lengths adjacent) into one token row, with the
    indices attention needs to run through padding when ``padded_attention`` (default: on CUDA)."""
    lengths = [len(ids) for ids, _ in seqs]
    groups = [(sum(1 for _ in run), length) for length, run in itertools.groupby(lengths)]
    ids = np.fromiter(itertools.chain.from_iterable(ids for ids, _ in seqs), dtype=np.int64, count=sum(lengths))
    if seqs and seqs[0][1] is not None:
        types = np.fromiter(itertools.chain.from_iterable(t for _, t in seqs), dtype=np.int64, count=len(ids))
    else:
        types = np.zeros(len(ids), dtype=np.int64)
    positions = np.concatenate([np.tile(np.arange(length, dtype=np.int64), n) for n, length in groups]) \
        if groups else np.zeros(0, dtype=np.int64)
    arrays = [ids, types, positions]
    if padded_attention is None:
        padded_attention = device.type == "cuda"
    padded_attention = padded_attention and len(groups) > 1
    if padded_attention:
        arrays.append(np.repeat(np.arange(len(lengths)), lengths))
        arrays.append(np.arange(max(lengths))[None, :] < np.asarray(lengths)[:, None])
    tensors = [torch.from_numpy(a) for a in arrays]
    if device.type == "cuda":  # pinned host memory lets the copy overlap the previous batch's kernels
        tensors = [t.pin_memory().to(device, non_blocking=True) for t in tensors]
    if padded_attention:
        return Packed(*tensors[:3], groups=groups, seq_index=tensors[3], key_mask=tensors[4][:, None, None, :])
    return Packed(*tensors, groups=groups)


# ---------------------------------------------------------------------------------------------------- towers
def supports_packing(encoder: nn.Module) -> bool:
    """BERT-family encoders with absolute positions and a known activation (the layout :class:`PackedBert`
    reads); everything else runs through its own forward, padded."""
    config = getattr(encoder, "config", None)
    return (config is not None and getattr(config, "model_type", None) == "bert"
            and getattr(config, "position_embedding_type", "absolute") == "absolute"
            and getattr(config, "hidden_act", None) in _ACTIVATIONS
            and not getattr(config, "is_decoder", False)
            and hasattr(encoder, "embeddings") and hasattr(encoder, "encoder"))


def onednn_linear_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether pre-packed, epilogue-fused oneDNN linear layers run here (x86/ARM CPU builds of torch with
    oneDNN, float32 or bfloat16)."""
    return (device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class FusedLinear(nn.Module):
    """``activation(x Wᵀ + b) + residual``: one oneDNN call with a pre-packed weight where available
    (:meth:`prepack`), else ``F.linear`` followed by the activation and the add. A layer has either an activation
    or a residual, not both (a transformer layer needs no more)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None
        self.activation = activation
        self.packed: torch.Tensor | None = None
        self.few_rows: tuple[np.ndarray, np.ndarray | None] | None = None  # (packed weight, fp32 bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str | None = None) -> "FusedLinear":
        return cls(linear.weight, linear.bias, activation)

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def prepack(self) -> "FusedLinear":
        """Re-lay the weight out once (after the final device and dtype are set): for oneDNN, and for the few-rows
        kernel where it runs (:func:`_few_rows_kernel`); no-op elsewhere."""
        self.packed, self.few_rows = None, None
        weight, dtype = self.weight.detach(), self.weight.dtype
        if onednn_linear_available(weight.device, dtype):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS_HINT)
        kernel = _few_rows_kernel(dtype) if weight.device.type == "cpu" else None
        pairs_fit = dtype != torch.bfloat16 or self.in_features % 2 == 0  # bf16 panels hold column pairs
        if kernel is not None and self.out_features % 32 == 0 and pairs_fit:
            bias = None if self.bias is None else self.bias.detach().float().numpy()
            packed = kernel.linear_bf16_pack(_bits(weight.contiguous())) if dtype == torch.bfloat16 else \
                kernel.linear_f32_pack(weight.contiguous().numpy())
            self.few_rows = (packed, bias)
        return self

    def _apply(self, fn, recurse=True):
        # packed copies of the old weight would be stale after .to()/.float()
        self.packed, self.few_rows = None, None
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.few_rows is not None and x.dtype == self.weight.dtype and x.dim() == 2 and x.shape[0] <= _FEW_ROWS:
            return self._forward_few_rows(x, residual)
        if self.packed is not None and x.dtype == self.weight.dtype:
            x = x.contiguous()
            if residual is not None:
                return torch.ops.mkldnn._linear_pointwise.binary(x, residual.contiguous(), self.packed, self.bias,
                                                                 "add")
            attr, algorithm = _ONEDNN_ACTIVATIONS[self.activation]
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, attr, [], algorithm)
        y = F.linear(x, self.weight, self.bias)
        if self.activation is not None:
            y = _ACTIVATIONS[self.activation](y)
        if residual is not None:
            y = y.add_(residual)
        return y

    def _forward_few_rows(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The few-rows kernel: fp32 sums, + bias, activation, + residual, rounded to bf16 once if bf16 (the order
        of oneDNN's fused epilogue)."""
        packed, bias = self.few_rows
        out = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
        activation, threads = _FEW_ROWS_ACTIVATIONS[self.activation], torch.get_num_threads()
        if x.dtype == torch.bfloat16:
            _few_rows_kernel(x.dtype).linear_bf16(_bits(x.contiguous()), packed, self.out_features, bias, activation,
                                                  None if residual is None else _bits(residual.contiguous()),
                                                  _bits(out), threads=threads)
        else:
            _few_rows_kernel(x.dtype).linear_f32(x.contiguous().numpy(), packed, self.out_features, bias, activation,
                                                 None if residual is None else residual.contiguous().numpy(),
                                                 out.numpy(), threads=threads)
        return out


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
        go through the compiled kernel (csrc/attention.h: AMX or AVX512-BF16 for bf16, AVX-512F for fp32; about 2x
        torch's CPU flash attention at head dimension 32), everything else through
        ``scaled_dot_product_attention``."""
        heads, head_dim = self.heads, self.hidden // self.heads
        kernel = _attention_kernel(qkv.dtype) if qkv.device.type == "cpu" and head_dim % 16 == 0 else None
        if kernel is not None:
            qkv = qkv.contiguous()
            out = torch.empty(qkv.shape[0], self.hidden, dtype=qkv.dtype)
            pairs = np.asarray(groups, dtype=np.int64).reshape(-1, 2)
            if qkv.dtype == torch.bfloat16:
                kernel.attention_bf16(_bits(qkv), _bits(out), pairs, heads, "", torch.get_num_threads())
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


def _bits(t: torch.Tensor) -> np.ndarray:
    """A 16-bit tensor's bits as a numpy uint16 array sharing its memory (numpy has no bfloat16)."""
    return t.view(torch.int16).numpy().view(np.uint16)


@functools.lru_cache(maxsize=None)
def _attention_kernel(dtype: torch.dtype):
    """``fastdpr._C`` when its attention kernel for ``dtype`` runs vectorised on this CPU (bf16: AMX or
    AVX512-BF16; fp32: AVX-512F), else None; like every compiled path it is off under ``FASTDPR_NO_NATIVE=1``."""
    from fastdpr.index._native import native

    names = {torch.bfloat16: "bf16", torch.float32: "f32"}
    module = native()
    if dtype not in names or module is None or not hasattr(module, "attention_f32"):
        return None
    return module if module.attention_paths(names[dtype])[0] != "scalar" else None


@functools.lru_cache(maxsize=None)
def _few_rows_kernel(dtype: torch.dtype):
    """``fastdpr._C`` where its few-rows linear layer for ``dtype`` is the fastest choice, else None: bf16 with
    AVX512-BF16, fp32 with AVX-512F, both only on CPUs without AMX (on AMX CPUs oneDNN's tiles are used at every
    row count for bf16, and fp32 has not been measured there). Off under ``FASTDPR_NO_NATIVE=1``."""
    from fastdpr.index._native import native

    module = native()
    if module is None or not hasattr(module, "linear_f32_paths") or module.attention_paths("bf16")[0] == "amx":
        return None
    if dtype == torch.bfloat16:
        return module if module.linear_bf16_paths()[0] == "avx512bf16" else None
    if dtype == torch.float32:
        return module if module.linear_f32_paths()[0] == "avx512" else None
    return None


def onednn_int8_available() -> bool:
    """Whether oneDNN's int8 linear (VNNI / AMX-INT8 on x86) is in this torch build."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops, "onednn")
            and hasattr(torch.ops.onednn, "qlinear_prepack") and hasattr(torch.ops.onednn, "qlinear_pointwise"))


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (symmetric, one scale per output row) and activations quantized per call
    to 0..255 (one scale and zero point for the call's whole input, from its range); the output in ``out_dtype``
    (float32, or bfloat16 with oneDNN). torch's ``quantize_dynamic``
    default keeps weights per tensor and activations at 7 bits (for CPUs without VNNI), which costs MiniLM ~0.07 of
    cosine; this costs ~0.005.

    Two kernels with the same integer arithmetic: oneDNN's int8 linear with the weight pre-packed and the activation
    fused (``backend="onednn"``, AMX-INT8 / VNNI), else fbgemm's dynamic linear (``"fbgemm"``, torch's quantized
    tensors)."""

    def __init__(self, linear: nn.Module, backend: str | None = None, out_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.activation = getattr(linear, "activation", None)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        bias = linear.bias.detach().float() if linear.bias is not None else None
        self.backend = backend or ("onednn" if onednn_int8_available() else "fbgemm")
        if out_dtype != torch.float32 and self.backend != "onednn":
            raise ValueError(f"Int8Linear: output dtype {out_dtype} needs the onednn backend")
        self.out_dtype = out_dtype
        if self.backend == "onednn":
            qweight = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
            self.packed = torch.ops.onednn.qlinear_prepack(qweight, None)
            self.weight_scale, self.bias = scale, bias
            self.weight_zero = torch.zeros(w.shape[0], dtype=torch.long)
            return
        with warnings.catch_warnings():
            # torch announces the removal of quantized tensor types; until then they are fbgemm's int8 GEMM's input
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(w, scale.double(), torch.zeros(w.shape[0], dtype=torch.long), 0,
                                                 torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(qweight, bias)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.backend == "onednn":
            x = x.contiguous()
            lo, hi = torch.aminmax(x)
            lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
            step = (hi - lo) / 255.0 or 1.0
            zero = int(round(-lo / step))
            xq = _quantize_u8(x, step, zero)
            attr, algorithm = _ONEDNN_ACTIVATIONS[self.activation]
            y = torch.ops.onednn.qlinear_pointwise(xq, step, zero, self.packed, self.weight_scale, self.weight_zero,
                                                   self.bias, 1.0, 0, self.out_dtype, attr,
                                                   [None] if attr == "none" else [], algorithm)
        else:
            y = torch.ops.quantized.linear_dynamic(x, self.packed, False)
            if self.activation is not None:
                y = _ACTIVATIONS[self.activation](y)
        return y.add_(residual) if residual is not None else y


def _quantize_u8(x: torch.Tensor, step: float, zero: int) -> torch.Tensor:
    """round(x / step) + zero, clamped to 0..255, as uint8, computed in float32 (bf16 cannot hold the integers
    above 256 it passes through). torch's quantize kernel does it in one pass (2x the elementwise chain); the chain
    is the fallback for torch builds that no longer have quantized tensors."""
    x = x.float()
    if hasattr(torch, "quantize_per_tensor"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the deprecation notice of quantized tensor types
            return torch.quantize_per_tensor(x, step, zero, torch.quint8).int_repr()
    return torch.round(x * (1.0 / step)).add_(zero).clamp_(0, 255).to(torch.uint8)


def quantize_linears(module: nn.Module) -> None:
    """Replace every ``nn.Linear`` under ``module`` by an :class:`Int8Linear`, in place."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child))
        else:
            quantize_linears(child)


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
            # not int8 runs in bf16 as in the bf16 tower (activations, attention, that layer): in fp32 it took
            # half of the int8 tower's time.
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
        if self.few_rows is not None and batch.seq_index is None and len(batch.input_ids) <= _FEW_ROWS:
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
        if self.few_rows is None or len(seq[0]) > _FEW_ROWS:
            return None
        return self.few_rows.vector(seq[0], seq[1], pooling, normalize)

    def _apply(self, fn, recurse=True):
        self.few_rows = None  # its arrays are views of the old weights
        return super()._apply(fn, recurse)


class FewRowsTower:
    """A bf16 or fp32 tower's forward pass for a few rows (a question at query time) in numpy arrays and compiled
    calls: the few-rows linear kernel, the attention kernel and the layer norm of ``fastdpr._C``, seven calls per
    layer and no torch operator, used by :class:`PackedBert` at up to ``_FEW_ROWS`` tokens where the few-rows kernel
    runs (:func:`_few_rows_kernel`).

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
        kernel = _few_rows_kernel(dtype) if dtype in (torch.bfloat16, torch.float32) else None
        if (kernel is None or not hasattr(kernel, "layer_norm") or bert.word.weight.device.type != "cpu"
                or _attention_kernel(dtype) is None or not len(bert.layers)):
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
            return packed, bias, layer.out_features, _FEW_ROWS_ACTIVATIONS[layer.activation]

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


class PaddedTower(nn.Module):
    """Any other encoder, padded per length-sorted batch, its weights in the compute precision."""

    def __init__(self, encoder: nn.Module, pad_id: int):
        super().__init__()
        self.encoder = copy.deepcopy(encoder)
        self.pad_id = pad_id
        self.compute_dtype = torch.float32

    def one_vector(self, seq, pooling: str, normalize: bool) -> None:
        return None  # no numpy path: pack and call the tower

    def set_precision(self, precision: str) -> "PaddedTower":
        if precision in ("bf16", "fp16"):
            self.encoder.to(DTYPES[precision])
            self.compute_dtype = DTYPES[precision]
        elif precision == "int8":
            quantize_linears(self.encoder)
        return self

    def forward(self, batch: Packed) -> torch.Tensor:
        """Packed in, packed out: padding lives only inside this call."""
        hidden_rows, start = [], 0
        n_seqs = batch.count
        longest = max(length for _, length in batch.groups)
        ids = torch.full((n_seqs, longest), self.pad_id, dtype=torch.long, device=batch.input_ids.device)
        types = torch.zeros_like(ids)
        mask = torch.zeros_like(ids)
        row = 0
        for n, length in batch.groups:
            rows = n * length
            ids[row:row + n, :length] = batch.input_ids[start:start + rows].view(n, length)
            types[row:row + n, :length] = batch.token_type_ids[start:start + rows].view(n, length)
            mask[row:row + n, :length] = 1
            row, start = row + n, start + rows
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if getattr(self.encoder.config, "type_vocab_size", 0):
            kwargs["token_type_ids"] = types
        hidden = self.encoder(**kwargs, return_dict=True).last_hidden_state
        row = 0
        for n, length in batch.groups:
            hidden_rows.append(hidden[row:row + n, :length].reshape(n * length, -1))
            row += n
        return torch.cat(hidden_rows)


def pool_packed(hidden: torch.Tensor, groups: list[tuple[int, int]], mode: str) -> torch.Tensor:
    """(tokens, H) packed states -> (sequences, H) float32: first token (``cls``) or mean over each sequence."""
    out, start = [], 0
    for n, length in groups:
        g = hidden[start:start + n * length].view(n, length, -1)
        out.append(g[:, 0].float() if mode == "cls" else g.float().mean(dim=1))
        start += n * length
    return torch.cat(out) if len(out) > 1 else out[0]


# The largest activation of one forward pass on a CPU, in bytes (see cpu_token_budget).
_CPU_ACTIVATION_BYTES = 12 << 20


def cpu_token_budget(layer: "_PackedLayer", dtype: torch.dtype) -> int:
    """Tokens per forward pass on a CPU: as many as keep the largest activation (the query-key-value or
    feed-forward output) under 12 MiB, 2,048 for MiniLM in fp32, 1,024 for BERT-base.

    Why: glibc's malloc serves blocks below its mmap threshold (which adapts up to 32 MiB) from a heap it
    reuses, but maps every larger block fresh, so each call faults in and zeroes its pages again: at batch 32
    of 134-token passages that was ~215k page faults per 256 passages and 8-10% of the fp32 time. Smaller passes
    also keep each layer's activations in cache. Matrix products keep their speed at 1-2k rows (measured on
    384→1536: the same GFLOP/s at 1,900 rows as at 4,300)."""
    widest = max(layer.qkv.out_features, layer.inter.out_features)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return max(1, _CPU_ACTIVATION_BYTES // (widest * itemsize))


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


__all__ = ["PRECISIONS", "ALIASES", "resolve_precision", "bf16_supported", "Packed", "pack", "PackedBert",
           "PaddedTower", "FusedLinear", "Int8Linear", "onednn_linear_available", "onednn_int8_available",
           "pool_packed", "build_tower", "supports_packing", "weights_state"]
