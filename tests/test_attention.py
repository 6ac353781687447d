"""fp32 attention for CPU training under bf16 autocast (fastdpr.models.attention)."""
import torch
import torch.nn.functional as F
from tiny_models import tiny_bert_dir, tiny_biencoder

from fastdpr.models.attention import NAME, fp32_cpu_attention, use_fp32_cpu_attention


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
        out, _ = fp32_cpu_attention(_Module(), q, k, v, mask, dropout=0.0, scaling=None)
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
            got, _ = fp32_cpu_attention(_Module(), q, k, v, None, dropout=0.0, scaling=None)
            want, _ = sdpa_attention_forward(_Module(), q, k, v, None, dropout=0.0, scaling=None)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_switched_model_trains_like_the_reference_and_the_switch_is_not_saved(tmp_path):
    from transformers import AutoModel

    path = tiny_bert_dir(tmp_path, dropout=0.0, seed=3)
    ref = AutoModel.from_pretrained(path, attn_implementation="sdpa")
    model = AutoModel.from_pretrained(path, attn_implementation="sdpa")
    assert use_fp32_cpu_attention(model) == 1
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
    assert use_fp32_cpu_attention(model) == 2  # question and passage towers
    assert use_fp32_cpu_attention(model) == 0  # already switched
    from transformers import AutoModel

    eager = AutoModel.from_pretrained(tiny_bert_dir(tmp_path, name="eager"), attn_implementation="eager")
    assert use_fp32_cpu_attention(eager) == 0
    assert eager.config._attn_implementation == "eager"
