"""CPU training attention (fastdpr.models.attention): fp32 under bf16 autocast, seeded dropout."""
import torch
import torch.nn.functional as F
from tiny_models import tiny_bert_dir, tiny_biencoder

import pytest

from fastdpr.models import attention
from fastdpr.models.attention import NAME, cpu_training_attention, use_cpu_training_attention


class _Module(torch.nn.Module):
    is_causal = False


def _qkv(dtype, seed, batch=3, heads=2, length=7, dim=16):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, dim, generator=g).to(dtype).requires_grad_() for _ in range(3)]


def test_half_inputs_with_grad_run_in_fp32():
    q, k, v = _qkv(torch.bfloat16, seed=11)
    mask = torch.zeros(3, 1, 7, 7, dtype=torch.bfloat16)
    mask[1, ..., 5:] = torch.finfo(torch.bfloat16).min  # row 1: last two keys are padding
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = cpu_training_attention(_Module(), q, k, v, mask, dropout=0.0, scaling=None)
    assert out.dtype == torch.bfloat16
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float())
    torch.testing.assert_close(out, want.transpose(1, 2).to(torch.bfloat16), rtol=0, atol=0)
    out.float().square().sum().backward()
    assert q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()


def test_other_inputs_are_transformers_sdpa_unchanged():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    for dtype, grad in [(torch.float32, True), (torch.bfloat16, False)]:
        q, k, v = _qkv(dtype, seed=5, length=9)
        with torch.set_grad_enabled(grad):
            got, _ = cpu_training_attention(_Module(), q, k, v, None, dropout=0.0, scaling=None)
            want, _ = sdpa_attention_forward(_Module(), q, k, v, None, dropout=0.0, scaling=None)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_switched_model_trains_like_the_reference_and_the_switch_is_not_saved(tmp_path):
    from transformers import AutoModel

    path = tiny_bert_dir(tmp_path, dropout=0.0, seed=3)
    ref = AutoModel.from_pretrained(path, attn_implementation="sdpa")
    model = AutoModel.from_pretrained(path, attn_implementation="sdpa")
    assert use_cpu_training_attention(model) == 1
    assert model.config._attn_implementation == NAME
    ids = torch.randint(5, 40, (4, 11), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[2, 7:] = 0
    grads = []
    for m in (ref, model):
        m.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = m(input_ids=ids, attention_mask=mask).last_hidden_state
        hidden.float()[:, 0].square().sum().backward()
        grads.append(m.encoder.layer[0].attention.self.query.weight.grad.clone())
    # same forward apart from the attention's precision: bf16-level agreement
    torch.testing.assert_close(grads[1], grads[0], rtol=0.1, atol=0.05)
    model.save_pretrained(tmp_path / "saved")
    assert NAME not in (tmp_path / "saved" / "config.json").read_text()
    reloaded = AutoModel.from_pretrained(tmp_path / "saved", attn_implementation="sdpa")
    assert reloaded.config._attn_implementation == "sdpa"


def test_biencoder_towers_switched_once_each_eager_left_alone(tmp_path):
    model = tiny_biencoder(tmp_path)
    assert use_cpu_training_attention(model) == 2  # question and passage towers
    assert use_cpu_training_attention(model) == 0  # already switched
    from transformers import AutoModel

    eager = AutoModel.from_pretrained(tiny_bert_dir(tmp_path, name="eager"), attn_implementation="eager")
    assert use_cpu_training_attention(eager) == 0
    assert eager.config._attn_implementation == "eager"


# ------------------------------------------------------------------------------------------------ seeded dropout

def test_compiled_dropout_equals_the_torch_reference():
    from fastdpr.models.compiled import kernels

    if getattr(kernels(), "dropout_", None) is None:
        pytest.skip("the compiled kernels are not built")
    g = torch.Generator().manual_seed(0)
    # lengths around the vector width (16 elements, 8 hashes a step) and odd ones, seeds of every sign
    for n, keep, seed in [(1, 0.9, 0), (7, 0.9, -5), (15, 0.9, 1), (16, 0.9, 2), (17, 0.9, 3), (33, 0.7, -1),
                          (100_001, 0.9, 2**62 + 3), (4096, 0.5, -(2**63)), (513, 1.0, 17), (513, 0.0, 17)]:
        x = torch.randn(n, generator=g) + 3.0  # no element is 0 before dropout
        want = attention.dropout_reference(x, keep, seed, 1.25)
        for path in kernels().dropout_paths():
            got = x.clone()
            kernels().dropout_(got.numpy(), keep, seed, 1.25, path)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="keep_prob"):
        kernels().dropout_(torch.ones(4).numpy(), 1.5, 0, 1.0)


def test_seeded_dropout_keeps_the_asked_fraction_independently_of_the_seed():
    x = torch.ones(200_000)
    masks = [attention.seeded_dropout_(x.clone(), 0.9, seed, 1.0) for seed in (1, 2)]
    for m in masks:
        assert abs(float(m.mean()) - 0.9) < 0.003
        assert set(m.unique().tolist()) == {0.0, 1.0}
    both = float((masks[0] * masks[1]).mean())
    assert abs(both - 0.81) < 0.004  # two seeds draw independent masks
    # neighbouring elements (the two lanes of one hash, and adjacent hashes) are independent too
    assert abs(float((masks[0][::2] * masks[0][1::2]).mean()) - 0.81) < 0.005
    assert abs(float((masks[0][1:-1:2] * masks[0][2::2]).mean()) - 0.81) < 0.005


def _attention_by_hand(q, k, v, mask, p, seed):
    probs = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + mask, dim=-1)
    return attention.dropout_reference(probs, 1 - p, seed, 1 / (1 - p)) @ v


def test_seeded_dropout_attention_forward_and_gradients_in_float64():
    q, k, v = _qkv(torch.float64, seed=3, length=6, dim=4)
    mask = torch.zeros(3, 1, 1, 6, dtype=torch.float64)
    mask[1, ..., 4:] = torch.finfo(torch.float64).min
    out = attention.SeededDropoutAttention.apply(q, k, v, mask, 0.3, 0.5, 1234)
    torch.testing.assert_close(out, _attention_by_hand(q, k, v, mask, 0.3, 1234), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b, c: attention.SeededDropoutAttention.apply(a, b, c, mask, 0.3, 0.5,
                                                                                           1234), (q, k, v))


@pytest.mark.parametrize("block_elements", [1, 150, 10**9])  # 2 rows a block (75 scores a row: odd), 2, one block
@pytest.mark.parametrize("mask_shape", [(5, 1, 1, 5), (1, 1, 5, 5), None])
def test_blocked_attention_draws_the_unblocked_mask(monkeypatch, block_elements, mask_shape):
    # blocks of batch rows keep the scores in cache; each block's seed must continue the whole tensor's mask
    monkeypatch.setattr(attention, "_BLOCK_ELEMENTS", block_elements)
    q, k, v = _qkv(torch.float64, seed=21, batch=5, heads=3, length=5, dim=4)
    mask = None
    if mask_shape is not None:
        mask = torch.zeros(mask_shape, dtype=torch.float64)
        mask[..., -1, 3:] = torch.finfo(torch.float64).min
        if mask_shape[0] == 5:
            mask[2] = 0.0
    seed = -8_123_456_789_012_345
    by_hand = _attention_by_hand(q, k, v, 0.0 if mask is None else mask, 0.4, seed)
    out = attention.SeededDropoutAttention.apply(q, k, v, mask, 0.4, 0.5, seed)
    torch.testing.assert_close(out, by_hand, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b, c: attention.SeededDropoutAttention.apply(a, b, c, mask, 0.4, 0.5,
                                                                                           seed), (q, k, v))
    # fp32 through the compiled mask kernel (when built): the same as one block
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    m32 = None if mask is None else mask.float().clamp_min(torch.finfo(torch.float32).min)
    out32 = attention.SeededDropoutAttention.apply(q32, k32, v32, m32, 0.4, 0.5, seed)
    out32.backward(torch.ones_like(out32))
    monkeypatch.setattr(attention, "_BLOCK_ELEMENTS", 10**9)
    q1, k1, v1 = (t.detach().clone().requires_grad_() for t in (q32, k32, v32))
    whole = attention.SeededDropoutAttention.apply(q1, k1, v1, m32, 0.4, 0.5, seed)
    whole.backward(torch.ones_like(whole))
    torch.testing.assert_close(out32, whole, rtol=1e-6, atol=1e-6)
    for a, b in ((q32, q1), (k32, k1), (v32, v1)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_dropout_path_replays_with_the_generator_state_and_matches_fp32_by_hand():
    q, k, v = _qkv(torch.float32, seed=8, length=9)
    mask = torch.ones(3, 1, 9, 9, dtype=torch.bool)
    mask[0, ..., 6:] = False  # bool masks (True = attend) as transformers passes them
    state = torch.get_rng_state()
    first, _ = cpu_training_attention(_Module(), q, k, v, mask, dropout=0.1, scaling=None)
    torch.set_rng_state(state)
    again, _ = cpu_training_attention(_Module(), q, k, v, mask, dropout=0.1, scaling=None)
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    torch.set_rng_state(state)
    seed = int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64))
    additive = torch.zeros(mask.shape).masked_fill_(~mask, torch.finfo(torch.float32).min)
    want = _attention_by_hand(q.detach(), k.detach(), v.detach(), additive, 0.1, seed).transpose(1, 2)
    torch.testing.assert_close(first.detach(), want, rtol=1e-5, atol=1e-6)
    # under bf16 autocast the output comes back in the input dtype, computed in fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half, _ = cpu_training_attention(_Module(), *[t.detach().to(torch.bfloat16) for t in (q, k, v)], mask,
                                         dropout=0.1, scaling=None)
    assert half.dtype == torch.bfloat16


def test_seeded_dropout_module_replays_and_backpropagates_through_the_same_mask():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.25), torch.nn.Dropout(0.0))
    assert attention.use_seeded_dropout(model) == 2
    assert attention.use_seeded_dropout(model) == 0  # already replaced
    assert isinstance(model[1], attention.SeededDropout) and model[1].p == 0.25
    x = torch.randn(64, 8, dtype=torch.float64)
    model.double()
    state = torch.get_rng_state()
    y = model(x)
    torch.set_rng_state(state)
    torch.testing.assert_close(model(x), y, rtol=0, atol=0)
    kept = y != 0
    assert 0.6 < float(kept.double().mean()) < 0.9
    # the gradient flows through the kept elements only, scaled like the forward pass
    torch.set_rng_state(state)
    seed = int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64))
    hidden = model[0](x)
    torch.testing.assert_close(y, attention.dropout_reference(hidden, 0.75, seed, 1 / 0.75), rtol=0, atol=0)
    w = torch.randn(64, 8, dtype=torch.float64)
    torch.set_rng_state(state)
    (model(x) * w).sum().backward()
    want = attention.dropout_reference(w, 0.75, seed, 1 / 0.75).t() @ x
    torch.testing.assert_close(model[0].weight.grad, want, rtol=1e-12, atol=1e-12)
    # bf16 tensors are masked in fp32 and come back in bf16; eval mode is the identity
    with torch.no_grad():
        half = model[1](hidden.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16 and (half == 0).any()
    model.eval()
    assert model(x).equal(model[0](x))


def test_switched_model_masks_padding_exactly_like_sdpa(tmp_path):
    # the padding mask is built by the implementation's name: a switched model must get SDPA's, not none
    from transformers import AutoModel

    path = tiny_bert_dir(tmp_path, dropout=0.0, seed=4)
    ref = AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
    model = AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
    assert use_cpu_training_attention(model) == 1
    ids = torch.randint(5, 40, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 4:] = 0
    mask[2, 7:] = 0
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).last_hidden_state
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # and with dropout on (training mode, the seeded path), padding keys still get no weight: changing them
    # changes nothing
    model.train()
    other = ids.clone()
    other[0, 4:] = 7
    outs = []
    for x in (ids, other):
        torch.manual_seed(0)
        outs.append(model(input_ids=x, attention_mask=mask).last_hidden_state[0, :4])
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
