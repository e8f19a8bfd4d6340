"""avo_ops.patch / unpatch: on small torch models, and on GPT-2, BERT and Llama from
Hugging Face Transformers built from small configs with random weights (no downloads).

For each Transformers model: one training step (loss, logits, every parameter's
gradient) of the patched model equals the unpatched one within the dtype's rounding;
torch.compile(fullgraph=True) of the patched model runs forward and backward with the
avo ops in its graph and gives the same results; state_dicts round-trip both ways;
unpatch restores the original modules.

Comparisons use the relative error of the whole tensor, ||a - b|| / ||b||: both models
round differently inside (the avo kernels keep fp32 where the torch modules round to the
dtype in between), so a per-element tolerance would be dominated by values near zero.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import avo_ops
from avo_ops import nn as avo_nn
from conftest import DEVICES

transformers = pytest.importorskip("transformers")

RELATIVE_ERROR = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
VOCAB, SEQ, BATCH = 128, 16, 2


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# ------------------------------------------------------------------ small torch models


def _mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(approximate="tanh"), nn.Linear(16, 16),
                         nn.RMSNorm(16, eps=1e-5), nn.SiLU(), nn.Linear(16, 16), nn.Softmax(dim=-1))


def test_patch_replaces_recognised_modules_and_reports_the_rest():
    model = _mlp()
    model.append(nn.LayerNorm((2, 8)))        # several dims: left
    model.append(nn.SiLU(inplace=True))       # in place: left
    model.append(nn.GroupNorm(2, 16))         # not recognised: reported
    report = avo_ops.patch(model)
    assert [(r.name, r.replacement) for r in report.replaced] == [
        ("1", "avo_ops.nn.LayerNorm"), ("2", "avo_ops.nn.GELU"), ("4", "avo_ops.nn.RMSNorm"),
        ("5", "avo_ops.nn.SiLU"), ("7", "avo_ops.nn.Softmax")]
    assert {(m.name, m.reason) for m in report.left} == {
        ("8", "normalized_shape (2, 8) spans several dimensions"), ("9", "inplace=True"),
        ("10", "not a recognised class")}
    assert model[2].approximate == "tanh" and model[4].eps == 1e-5
    assert "replaced 1: torch.nn.modules.normalization.LayerNorm -> avo_ops.nn.LayerNorm" in str(report)


def test_patch_keeps_the_parameters_and_unpatch_restores_the_modules():
    model = _mlp()
    originals = list(model)
    params = list(model.parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 8)
    expected = model(x)
    avo_ops.patch(model)
    assert list(model.parameters()) == params  # the same Parameter objects, same order
    assert all(a is b for a, b in zip(model.parameters(), params))
    assert model.state_dict().keys() == state.keys()
    torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-6)
    # A training step through the patched model updates the shared parameters.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x).square().sum().backward()
    optimizer.step()
    assert not torch.equal(model[1].weight, state["1.weight"])
    assert avo_ops.unpatch(model) == 5
    assert all(a is b for a, b in zip(model, originals))
    assert all(a is b for a, b in zip(model.parameters(), params))


def test_unpatch_takes_parameters_replaced_after_patching():
    model = _mlp()
    avo_ops.patch(model)
    fresh = _mlp().state_dict()
    model.load_state_dict(fresh, assign=True)  # new Parameter objects in the replacements
    avo_ops.unpatch(model)
    assert type(model[1]) is nn.LayerNorm
    torch.testing.assert_close(model[1].weight, fresh["1.weight"])
    assert model[1].weight is model.state_dict(keep_vars=True)["1.weight"]


def test_a_module_used_twice_gets_one_replacement():
    act = nn.GELU()
    model = nn.Sequential(nn.Linear(4, 4), act, nn.Linear(4, 4), act)
    report = avo_ops.patch(model)
    assert [r.name for r in report.replaced] == ["1", "3"]
    assert model[1] is model[3] and isinstance(model[1], avo_nn.GELU)
    avo_ops.unpatch(model)
    assert model[1] is act and model[3] is act


def test_kinds_restrict_the_patch():
    model = _mlp()
    report = avo_ops.patch(model, kinds=["layernorm"])
    assert [r.name for r in report.replaced] == ["1"]
    assert {m.reason for m in report.left} == {"kind 'gelu' not asked for", "kind 'rmsnorm' not asked for",
                                               "kind 'silu' not asked for", "kind 'softmax' not asked for"}
    with pytest.raises(ValueError, match=r"avo_ops.patch: unknown kinds \['groupnorm'\]"):
        avo_ops.patch(model, kinds=["groupnorm"])


def test_modules_with_hooks_and_subclasses_are_left():
    class MyNorm(nn.LayerNorm):
        pass

    hooked = nn.LayerNorm(8)
    hooked.register_forward_hook(lambda *args: None)
    model = nn.Sequential(hooked, MyNorm(8))
    report = avo_ops.patch(model)
    assert report.replaced == []
    assert [(m.name, m.reason) for m in report.left] == [("0", "has hooks registered"), ("1", "not a recognised class")]


def test_patching_twice_changes_nothing_more():
    model = _mlp()
    avo_ops.patch(model)
    again = avo_ops.patch(model)
    assert again.replaced == [] and again.left == []


# ------------------------------------------------------------- Transformers models


def _gpt2():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def _bert():
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    return transformers.BertForMaskedLM(config)


def _llama():
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


# model -> (factory, {replaced class name: count})
MODELS = {
    "gpt2": (_gpt2, {"torch.nn.modules.normalization.LayerNorm": 5,
                     "transformers.activations.NewGELUActivation": 2}),
    "bert": (_bert, {"torch.nn.modules.normalization.LayerNorm": 6,
                     "transformers.activations.GELUActivation": 3}),
    "llama": (_llama, {"transformers.models.llama.modeling_llama.LlamaRMSNorm": 5,
                       "transformers.activations.SiLUActivation": 2}),
}
CASES = [("cpu", torch.float32)] + ([("cuda", torch.float32), ("cuda", torch.bfloat16)]
                                    if "cuda" in DEVICES else [])
CASE_IDS = [f"{d}-{str(t).replace('torch.', '')}" for d, t in CASES]


def _build(name, device, dtype, seed=0):
    torch.manual_seed(seed)
    model = MODELS[name][0]().to(device=device, dtype=dtype)
    model.train()
    return model


def _batch(device, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator).to(device)}


def _training_step(model, batch):
    """Loss, logits and every parameter's gradient of one step. The loss (predict the
    input tokens) is computed outside the model, so that a compiled model holds the
    network alone (the models' own loss path logs a notice, which dynamo cannot trace)."""
    model.zero_grad(set_to_none=True)
    logits = model(**batch).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch["input_ids"].flatten())
    loss.backward()
    module = getattr(model, "_orig_mod", model)  # the model behind a torch.compile wrapper
    grads = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
    return loss.detach(), logits.detach(), grads


def _assert_steps_match(got, expected, dtype):
    tolerance = RELATIVE_ERROR[dtype]
    (loss, logits, grads), (loss_ref, logits_ref, grads_ref) = got, expected
    assert _relative_error(loss, loss_ref) < tolerance
    assert _relative_error(logits, logits_ref) < tolerance
    assert grads.keys() == grads_ref.keys()
    # Some gradients are zero in exact arithmetic (the key bias of attention: softmax
    # ignores a shift per query) and hold only rounding noise; each tensor's error is
    # measured against its own size, but not less than 1% of the largest gradient.
    floor = 0.01 * max(g.double().norm().item() for g in grads_ref.values())
    for name, g in grads.items():
        error = (g.double() - grads_ref[name].double()).norm().item()
        assert error < tolerance * max(grads_ref[name].double().norm().item(), floor), name


@pytest.mark.parametrize("device, dtype", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("name", list(MODELS))
def test_training_step_of_patched_model_equals_unpatched(name, device, dtype):
    model = _build(name, device, dtype)
    patched = copy.deepcopy(model)
    report = avo_ops.patch(patched)
    replaced = {}
    for r in report.replaced:
        replaced[r.original] = replaced.get(r.original, 0) + 1
    assert replaced == MODELS[name][1]
    assert all(p.device.type == device and p.dtype == dtype for p in patched.parameters())
    batch = _batch(device)
    _assert_steps_match(_training_step(patched, batch), _training_step(model, batch), dtype)


@pytest.mark.parametrize("device, dtype", CASES[:2], ids=CASE_IDS[:2])
@pytest.mark.parametrize("name", list(MODELS))
def test_compiled_patched_model_runs_fullgraph_with_avo_ops(name, device, dtype):
    torch._dynamo.reset()
    model = _build(name, device, dtype)
    expected = _training_step(model, _batch(device))
    avo_ops.patch(model)
    seen_ops = set()

    def backend(graph_module, example_inputs):
        seen_ops.update(str(node.target) for node in graph_module.graph.nodes if node.op == "call_function")
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(graph_module, example_inputs)

    compiled = torch.compile(model, fullgraph=True, backend=backend)  # any graph break raises
    got = _training_step(compiled, _batch(device))
    assert any("avo." in op for op in seen_ops), sorted(seen_ops)
    _assert_steps_match(got, expected, dtype)


@pytest.mark.parametrize("name", list(MODELS))
def test_state_dict_round_trips_between_patched_and_unpatched(name):
    model = _build(name, "cpu", torch.float32, seed=0)
    patched = copy.deepcopy(model)
    avo_ops.patch(patched)
    assert patched.state_dict().keys() == model.state_dict().keys()
    batch = _batch("cpu")
    with torch.no_grad():
        expected = model(**batch).logits
        # patched -> a fresh unpatched model
        fresh = _build(name, "cpu", torch.float32, seed=7)
        fresh.load_state_dict(patched.state_dict())
        assert _relative_error(fresh(**batch).logits, expected) < 1e-6
        # unpatched -> a fresh patched model
        fresh_patched = _build(name, "cpu", torch.float32, seed=7)
        avo_ops.patch(fresh_patched)
        fresh_patched.load_state_dict(model.state_dict())
        assert _relative_error(fresh_patched(**batch).logits, expected) < RELATIVE_ERROR[torch.float32]


@pytest.mark.parametrize("name", list(MODELS))
def test_unpatch_restores_the_transformers_modules(name):
    model = _build(name, "cpu", torch.float32)
    classes = [type(m) for m in model.modules()]
    report = avo_ops.patch(model)
    assert report.replaced
    assert avo_ops.unpatch(model) == len(report.replaced)
    assert [type(m) for m in model.modules()] == classes


def test_llama_style_rmsnorm_classes_are_recognised_by_their_forward():
    """Mistral's and Qwen2's RMSNorm have Llama's forward and are replaced; Gemma's
    (x * (1 + weight)) does not and is reported as left."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.mistral.modeling_mistral import MistralRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    model = nn.Sequential(MistralRMSNorm(16, eps=1e-5), Qwen2RMSNorm(16), GemmaRMSNorm(16))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    x = torch.randn(3, 16)
    expected = model(x)
    report = avo_ops.patch(model)
    assert [r.name for r in report.replaced] == ["0", "1"]
    assert [(m.name, m.reason) for m in report.left] == [("2", "not a recognised class")]
    assert model[0].eps == 1e-5 and isinstance(model[0], avo_nn.RMSNorm)
    torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)


def test_uncovered_call_in_a_patched_model_runs_the_original_module():
    """A Llama RMSNorm with fp32 weight on bf16 activations (mixed dtypes): the original
    module's own formula runs, including its dtype promotion."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    model = nn.Sequential(LlamaRMSNorm(16))
    x = torch.randn(3, 16).bfloat16()
    expected = model(x)
    avo_ops.patch(model)
    with pytest.warns(UserWarning, match="mixed dtypes"):
        avo_nn._warned.clear()
        got = model(x)
    assert got.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(got, expected)
