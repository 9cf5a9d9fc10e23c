"""What the page says: the introduction, each control's help line, how to read the panels and the sweep."""

EMPTY_MESSAGE = "Type a message first: an empty or blank message has nothing to answer."


def exactness(dtype, choice=None) -> str:
    """Which dtype the reply ran in, why (``models.DtypeChoice``), and what exactness means there (docs/DESIGN.md
    §2.5)."""
    name = str(dtype).removeprefix("torch.")
    why = f" ({choice.reason})" if choice else ""
    if name == "float32":
        return (
            f"Ran in float32{why}: the reply is plain decoding's token for token (greedy), and the same tokens at the "
            "same seed when sampling."
        )
    return (
        f"Ran in {name}{why}: the reply equals plain {name} decoding up to rounding (a forward over many "
        "tokens rounds differently from a one-token forward, so a reply may part from it at a near-tie). "
        "`--dtype float32` (or `XPRESS_DTYPE=float32`) gives plain decoding's tokens exactly."
    )


HELP = {
    "preset": (
        "Target LM + drafter. Loaded on first use, then shared read-only by all users. The diffusion drafters: "
        "masked (positions start as MASK) or gaussian (token embeddings start as Gaussian noise)."
    ),
    "drafts": (
        "K candidate drafts per round, verified together as one token tree; with a draft tree (Drafts: tree), the "
        "tree holds K x L draft tokens."
    ),
    "diversity": (
        "tree: one row refined over the T steps, then the tree of K x L draft tokens its last step expects to get the "
        "most tokens accepted (the fastest here). The others are K separate drafts refined together: branch-first "
        "branches them on the drafter's top K first tokens, branch-uncertain at the least sure position, gumbel "
        "draws them with noise, none leaves them alike."
    ),
    "block": "L tokens per draft: a round accepts at most L draft tokens, plus one token from the target.",
    "steps": (
        "T steps per round (1..L). T=1 fills the block in one drafter forward. With a refiner head (the embedded "
        "drafter has one) each further step is a refinement pass: every position re-reads the tokens the pass before "
        "drafted ahead of it, all positions at once, so pass p fixes the first p positions' view of each other (a pass "
        "costs a small head, not a drafter forward; changed tokens are outlined in the draft panel). Without a head, "
        "a step is a denoise step: T=L commits one position per step, like autoregressive drafting."
    ),
    "temperature": (
        "0 = greedy. Above 0 the target samples, and the output distribution is still exactly its own; the drafter "
        "reads the noise of the target's coming draws, so it drafts the tokens the target is about to sample."
    ),
    "top_p": "Nucleus cut-off, applied exactly as plain sampling applies it (only with temperature > 0).",
    "seed": "Same seed and settings give the same text, with or without the drafter.",
    "max_new_tokens": "Upper bound on the reply length, in tokens.",
    "refine": (
        "parallel: the K drafts go through each step as one batch (one batched forward or refinement pass a step); "
        "serial: one draft at a time (K x T). Same drafts, different cost. A draft tree refines one row."
    ),
    "verify": (
        "tree: drafts merged into a trie, checked in one target forward with a tree attention mask; "
        "batch: K rows over copies of the cache (simpler, K x the memory)."
    ),
    "race": (
        "Also decode the request plainly (no drafter) and compare speeds, each from its own start (prefill "
        "included). The two runs take turns, each one's timings count only its own work, and which starts first "
        "alternates from one message to the next."
    ),
    "auto": (
        "Runs the drafts K, steps T and block L chosen when the models loaded for the most expected tokens per second "
        "(the drafter's acceptance on a few requests over the stage costs measured then, drafting kept only where those "
        "requests also decoded faster than plain steps; kept per machine and models), and each round verifies only the "
        "drafted tokens its chances pay for (none: a plain step). Where plain steps were chosen, a reply still drafts "
        "now and then and goes on drafting while that pays on its own text. Untick to pin K, T, L below."
    ),
    "animate": (
        "Replay every round's denoise steps in the draft panel while generating. Slower to watch; "
        "the timings shown exclude it."
    ),
}

INTRO = """### xPress · speculative decoding with a diffusion drafter
A small **drafter** proposes K drafts of L tokens by denoising them in T steps; the **target** LM checks them all in one
forward and keeps what it agrees with, plus one token of its own: the same text as the target alone, faster when the
drafts are good.
"""

DEFAULTS_NOTE = (
    "Starts with Auto on: the setting with the most tokens per second by what the hardware running the app measured "
    "when the models loaded. "
    "Pinned, K=1 · T=1 · L=8 (a draft tree of 8 tokens) is the fastest fixed setting the benchmark measured on a 2-core "
    "CPU, on SmolLM2 and on the embedded models (README, Latest results)."
)

# One click sends each: a booking (the chats the embedded target learned most from), a story, small talk.
EXAMPLES = {
    "Book a table": "I want to book a table for two at an Italian restaurant tonight.",
    "Tell a story": "Tell me a story about a little fox.",
    "Small talk": "Do you like football?",
}

VERDICT_PENDING = (
    "After a reply, this line says how much faster or slower it was than plain decoding, whole (the prompt's "
    "prefill included) and per round: τ (tokens per round) against what a round cost, counted in plain decoding steps."
)

PANEL_HELP = """
- **Draft evolution**: rows are the K drafts, columns the L block positions. Grey cells are still masked; colour is
  the drafter's confidence. After the last step the cells the target accepted get a green frame and each draft's first
  rejected token a red one; ★ marks the draft on the chosen path. Past 5 drafts (a tree's paths) the panel shows the
  chosen one and the longest accepted others, and says how many more there are. Scrub any round and step with the sliders. The
  second title line names the round's setting (K, T, L), which Auto chose at load, or says it was a plain step.
  With the gaussian drafter no cell is masked: every step shows each position's nearest token at that noise level.
- **Accepted length**: draft tokens accepted per round (grey dots: each draft; green: the chosen path), the running
  τ (tokens emitted per round, the speed-up's upper bound) and a histogram.
- **Latency**: what each drafting round cost, split into draft / verify / other and counted in plain decoding steps
  (one step of the target alone, measured beside the reply: the Race, Auto's own plain steps, or 8 timed right after
  it), beside the tokens the round emitted. The dashed line is the break-even τ (a round's mean cost): rounds that
  emit more tokens than they cost beat plain decoding. Below: tokens/s so far, beside plain decoding when Race is on.
  Times are the engine's own: rendering is excluded; the prompt's prefill (the same for both) is in the status line.
- **The verdict** above the draft panel: first the whole reply against plain decoding of the same tokens (the same
  prefill, then one plain step per token), which is what the Race measures; then the rounds' own speedup, the
  prefill aside: τ × (1 / plain steps per round). A short reply's whole speedup is below its rounds': both wait for
  the prefill. With Race on, the Race line says whether its measurement agrees (within 15 %), or why not.
- **Token provenance**: the reply, each token coloured by where it came from: an accepted draft token or the target's
  own token (the one each round adds after the accepted path). Shades alternate with the round.
"""


SWEEP_HELP = """Measures tokens/s and τ over a grid of drafts K × denoise steps T at one block length L, on the model
preset chosen in the Chat tab, against plain decoding (transformers `generate`) on the same prompts. Every setting
first runs once to warm up (on the longest prompt), then up to three times per prompt (as often as 48 runs allow),
greedy, the settings taking turns prompt by prompt. tokens/s is the median of the repeats, with their range; the
speedup is the median of the runs' own (each run against plain decoding's on the same prompt, run beside it), with the
middle half of them. Each output is compared with plain decoding's. Other work on the machine (replies decoded meanwhile, other processes) slows plain decoding's many small
forwards more than the drafts' few larger ones: the status says how busy the machine was while it measured. In
bfloat16 a few outputs may part from plain decoding's by rounding (explained there); in float32 none may."""
