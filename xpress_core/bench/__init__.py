"""The benchmark (``python -m xpress_core bench``): tokens/s of xPress side by side with what users would otherwise
pick.

Methods, run in ONE process on the same target, prompts and ``max_new_tokens``, interleaved prompt by prompt:

1. ``hf-generate``: transformers ``generate`` (the reference every speedup divides by);
2. ``hf-assisted``: transformers assisted generation with the autoregressive drafter, several draft lengths;
3. ``hf-prompt-lookup``: transformers prompt lookup decoding, several candidate lengths;
4. ``xpress-none``: the xPress engine without a drafter (its own overhead);
5. ``xpress``: the xPress engine with the diffusion drafter over a (K, T, L, refine, verify) grid.

Every call is timed as a whole (CUDA-synchronized before and after). Per-round facts come from the engine's own
events for xPress, and from forward hooks on the target and the assistant for transformers (which has no events):
one target forward is one verify round there. Greedy outputs are compared with ``hf-generate`` token for token;
sampled xPress outputs with ``xpress-none`` at the same seed (the engine's "same seed, same text" promise).

Modules: ``grid`` (the xPress settings) · ``methods`` (what is compared, and on which models) · ``hf`` (the
transformers methods and their forward hooks) · ``measure`` (timed calls, output checks; ``sweep`` for the app) ·
``summary`` (per-setting medians and speedups) · ``stages`` (search, then final) · ``report`` (goals, table, files) ·
``figures`` (plotly) · ``cli``. The held-out prompts live in ``xpress_core.data``.
"""
