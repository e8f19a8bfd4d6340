"""Swap avo modules into a model that is already built, and back.

    report = avo_ops.patch(model)      # in place; returns what it replaced and what it left
    print(report)
    avo_ops.unpatch(model)             # the original modules again

A replacement shares the Parameter objects of the module it replaces, so weights, dtype,
device, ``requires_grad``, ``state_dict`` keys and an optimizer built on
``model.parameters()`` all stay as they were. It keeps the original (unregistered) to
give it back on ``unpatch`` and to run it for a call the kernels do not cover.

Recognised (exact classes; a subclass may change forward, so it is left):

- torch.nn: LayerNorm (one normalized dimension), RMSNorm (one normalized dimension),
  GELU, SiLU (not in-place), Softmax (dim=-1);
- Hugging Face Transformers: every RMSNorm class whose forward is Llama's
  (``weight * normalize(x in float32).to(x.dtype)``: LlamaRMSNorm, MistralRMSNorm,
  Qwen2RMSNorm and about a hundred more), and the activation classes GELUActivation
  (BERT), NewGELUActivation (GPT-2), GELUTanh, AccurateGELUActivation, SiLUActivation.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Union

from torch import nn

from . import nn as avo_nn
from .nn import share_parameters

__all__ = ["patch", "unpatch", "PatchReport", "KINDS"]

# What patch(model, kinds=...) can be restricted to.
KINDS = ("layernorm", "rmsnorm", "gelu", "silu", "softmax")

# A rule gives the replacement, or a string saying why the module is left as it is.
Rule = Callable[[nn.Module], Union[nn.Module, str]]


@dataclass(frozen=True)
class Replaced:
    name: str           # qualified name in the model
    original: str       # class of the module replaced
    replacement: str    # avo class that took its place


@dataclass(frozen=True)
class Left:
    name: str
    cls: str
    reason: str


@dataclass
class PatchReport:
    """What ``patch`` did: the modules it replaced, and the norm- and activation-like
    modules it saw and left (with why)."""

    replaced: list[Replaced] = field(default_factory=list)
    left: list[Left] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"avo_ops.patch: replaced {len(self.replaced)} module(s), left {len(self.left)}"]
        lines += [f"  replaced {r.name or '<root>'}: {r.original} -> {r.replacement}" for r in self.replaced]
        lines += [f"  left     {m.name or '<root>'}: {m.cls} ({m.reason})" for m in self.left]
        return "\n".join(lines)


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _same_code(f, g) -> bool:
    """True when two functions compile to the same bytecode, constants and names."""
    a, b = getattr(f, "__code__", None), getattr(g, "__code__", None)
    if a is None or b is None:
        return False
    return (a.co_code, a.co_consts, a.co_names, a.co_varnames) == (b.co_code, b.co_consts, b.co_names, b.co_varnames)


def _adopt(replacement: nn.Module, original: nn.Module) -> nn.Module:
    """Give `replacement` the parameters, mode and identity link of `original`."""
    share_parameters(original, replacement)
    replacement.train(original.training)
    replacement.__dict__["_avo_original"] = original  # not a submodule: no state_dict entry
    return replacement


# ---------------------------------------------------------------- torch.nn rules

def _layer_norm(m: nn.LayerNorm):
    if len(m.normalized_shape) != 1:
        return f"normalized_shape {tuple(m.normalized_shape)} spans several dimensions"
    new = avo_nn.LayerNorm(m.normalized_shape, m.eps, m.elementwise_affine, bias=m.bias is not None, device="meta")
    return _adopt(new, m)


def _rms_norm(m: nn.RMSNorm):
    if len(m.normalized_shape) != 1:
        return f"normalized_shape {tuple(m.normalized_shape)} spans several dimensions"
    return _adopt(avo_nn.RMSNorm(m.normalized_shape, m.eps, m.elementwise_affine, device="meta"), m)


def _gelu(m: nn.GELU):
    return _adopt(avo_nn.GELU(m.approximate), m)


def _silu(m: nn.SiLU):
    if m.inplace:
        return "inplace=True"
    return _adopt(avo_nn.SiLU(), m)


def _softmax(m: nn.Softmax):
    if m.dim != -1:
        return f"dim={m.dim} (only dim=-1 is known to be the last dimension before a call)"
    return _adopt(avo_nn.Softmax(-1), m)


# ------------------------------------------------------- Hugging Face Transformers rules

def _transformers_rules() -> dict[str, tuple[str, Rule]]:
    """Rules for Transformers classes, by class name; empty when the model cannot hold
    any (transformers not imported)."""
    if "transformers" not in sys.modules:
        return {}
    return {
        "GELUActivation": ("gelu", lambda m: _adopt(avo_nn.GELU("none"), m)),
        "NewGELUActivation": ("gelu", lambda m: _adopt(avo_nn.GELU("tanh"), m)),
        "GELUTanh": ("gelu", lambda m: _adopt(avo_nn.GELU("tanh"), m)),
        "AccurateGELUActivation": ("gelu", lambda m: _adopt(avo_nn.GELU("tanh"), m)),
        "SiLUActivation": ("silu", lambda m: _adopt(avo_nn.SiLU(), m)),
    }


def _llama_rms_norm_forward():
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
    except ImportError:  # pragma: no cover - transformers without Llama
        return None
    return LlamaRMSNorm.forward


def _llama_style_rms_norm(m: nn.Module):
    weight = getattr(m, "weight", None)
    eps = getattr(m, "variance_epsilon", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 1 or not isinstance(eps, float):
        return "an RMSNorm with Llama's forward but not its weight/variance_epsilon"
    new = avo_nn.RMSNorm(weight.shape[0], eps, device="meta")
    return _adopt(new, m)


_TORCH_RULES: dict[type, tuple[str, Rule]] = {
    nn.LayerNorm: ("layernorm", _layer_norm),
    nn.RMSNorm: ("rmsnorm", _rms_norm),
    nn.GELU: ("gelu", _gelu),
    nn.SiLU: ("silu", _silu),
    nn.Softmax: ("softmax", _softmax),
}

# Class names that look like a norm or an activation: reported when left unrecognised.
_LOOKS_RELEVANT = ("Norm", "GELU", "Gelu", "SiLU", "Silu", "Swish", "Softmax", "Activation")


def _rule_for(module: nn.Module, hf_rules, llama_forward) -> Optional[tuple[str, Rule]]:
    cls = type(module)
    if cls in _TORCH_RULES:
        return _TORCH_RULES[cls]
    if cls.__module__.startswith("transformers."):
        if cls.__name__ in hf_rules:
            return hf_rules[cls.__name__]
        if cls.__name__.endswith("RMSNorm") and llama_forward is not None and _same_code(cls.forward, llama_forward):
            return ("rmsnorm", _llama_style_rms_norm)
    return None


def _has_hooks(module: nn.Module) -> bool:
    return any(getattr(module, hooks, None) for hooks in (
        "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"))


def patch(model: nn.Module, kinds: Optional[Iterable[str]] = None) -> PatchReport:
    """Replace, in place, the modules of `model` that avo kernels compute (see the
    module docstring for the classes recognised). `kinds` restricts it to some of
    ``KINDS`` ("layernorm", "rmsnorm", "gelu", "silu", "softmax"). Returns a
    PatchReport; ``unpatch(model)`` undoes it."""
    wanted = set(KINDS if kinds is None else kinds)
    unknown = wanted - set(KINDS)
    if unknown:
        raise ValueError(f"avo_ops.patch: unknown kinds {sorted(unknown)}; choose from {list(KINDS)}")
    hf_rules = _transformers_rules()
    llama_forward = _llama_rms_norm_forward() if hf_rules else None
    report = PatchReport()
    # A module used in several places gets one replacement, put in each place.
    made: dict[int, nn.Module] = {}
    # Collect first: the tree must not change while it is walked.
    for name, module in list(model.named_modules(remove_duplicate=False)):
        cls = type(module)
        if isinstance(module, avo_nn._AvoModule):
            continue
        if id(module) in made:
            _set_submodule(model, name, made[id(module)])
            report.replaced.append(Replaced(name, _qualname(cls), _qualname(type(made[id(module)]))))
            continue
        rule = _rule_for(module, hf_rules, llama_forward)
        if rule is None:
            if any(word in cls.__name__ for word in _LOOKS_RELEVANT):
                report.left.append(Left(name, _qualname(cls), "not a recognised class"))
            continue
        kind, make = rule
        if kind not in wanted:
            report.left.append(Left(name, _qualname(cls), f"kind '{kind}' not asked for"))
            continue
        if _has_hooks(module):
            report.left.append(Left(name, _qualname(cls), "has hooks registered"))
            continue
        if name == "":
            report.left.append(Left(name, _qualname(cls), "the model itself; use avo_ops.nn directly"))
            continue
        replacement = make(module)
        if isinstance(replacement, str):
            report.left.append(Left(name, _qualname(cls), replacement))
            continue
        made[id(module)] = replacement
        _set_submodule(model, name, replacement)
        report.replaced.append(Replaced(name, _qualname(cls), _qualname(type(replacement))))
    return report


def unpatch(model: nn.Module) -> int:
    """Put back every module ``patch`` replaced in `model`, with the replacement's
    current parameters. Returns how many were put back."""
    restored = 0
    for name, module in list(model.named_modules(remove_duplicate=False)):
        original = module.__dict__.get("_avo_original")
        if original is None or name == "":
            continue
        share_parameters(module, original)
        original.train(module.training)
        _set_submodule(model, name, original)
        restored += 1
    return restored


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)
