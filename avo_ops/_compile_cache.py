"""torch.compile's caches keyed by the avo ops' schemas.

torch.compile keeps compiled graphs on disk (`TORCHINDUCTOR_CACHE_DIR`), and their keys
cover torch and the graph but not the schemas of the custom ops a graph calls: a graph
compiled with another build of avo_ops, whose ops took other arguments (a backward that
read other saved values, say), would be loaded and fail when run.
Adding a digest of the schemas to torch's cache key tag makes such a graph compile
again instead; builds with the same schemas share the cache.
"""
from __future__ import annotations

import hashlib

import torch

NAMESPACE = "avo"


def schemas_digest() -> str:
    """A digest of the schemas of every registered op of the namespace."""
    prefix = NAMESPACE + "::"
    names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix))
    schemas = [str(getattr(getattr(torch.ops, NAMESPACE), n[len(prefix):]).default._schema) for n in names]
    return hashlib.sha256("\n".join(schemas).encode()).hexdigest()[:16]


def tag_compile_caches() -> None:
    """Add `avo_ops:<digest>` to torch.compiler.config.cache_key_tag (once; a tag set by
    the user stays in it)."""
    config = getattr(torch.compiler, "config", None)
    if config is None or not hasattr(config, "cache_key_tag"):
        return  # a torch without the tag: its caches stay as they are
    tag = f"avo_ops:{schemas_digest()}"
    if tag not in config.cache_key_tag.split():
        config.cache_key_tag = " ".join(filter(None, [config.cache_key_tag, tag]))
