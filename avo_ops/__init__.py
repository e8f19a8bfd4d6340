"""avo_ops: fused, differentiable PyTorch operators generated from YAML specs.

Importing the package loads the compiled extension (`avo_ops._C`), whose static
initializers register every op under `torch.ops.avo`, then the generated Python glue
(fake implementations, autograd.Function classes, functional API).

    import torch, avo_ops
    y = torch.ops.avo.gelu(x)          # the registered op
    y = avo_ops.gelu(x, "tanh")        # the functional API (the same op)
    norm = avo_ops.nn.LayerNorm(1024)  # drop-in modules
    report = avo_ops.patch(model)      # swap them into a built model (avo_ops.unpatch undoes it)
"""
from __future__ import annotations

import torch  # noqa: F401  (the extension links against torch's libraries)

from . import _C  # noqa: F401  (registers the ops)
from ._generated import *  # noqa: F401,F403
from ._generated import OPS, __all__ as _generated_names
from . import nn  # noqa: E402  (drop-in modules; after the ops they call)
from .patching import PatchReport, patch, unpatch  # noqa: E402
from ._compile_cache import tag_compile_caches  # noqa: E402

tag_compile_caches()  # compiled graphs of a build whose ops took other arguments compile again

__version__ = "0.1.0"


def built_with_cuda() -> bool:
    """True when this build has CUDA kernels."""
    return bool(_C.built_with_cuda())


__all__ = ["OPS", "built_with_cuda", "nn", "patch", "unpatch", "PatchReport", *_generated_names]
