"""Self-distillation data: the frozen target writes continuations of corpus prompts (greedy and sampled).

Works for any HF causal-LM target and text files, not only ours. Chunks are saved as they are written, so an
interrupted run resumes where it stopped. The settings that shaped them are kept beside them (``distill.json``): a
drafter's training summary records them, and a command asking the same folder for other sequences is refused
instead of resuming into a mix.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..cache import new_cache
from ..errors import XpressError
from .corpus import load_tokens


@dataclass(frozen=True)
class DistillConfig:
    sequences: int = 8192  # prompt + continuation sequences to write
    prompt_len: int = 96
    new_tokens: int = 96
    batch_size: int = 64
    sample_fraction: float = 0.5  # the rest is greedy
    temperature: float = 0.8
    seed: int = 0
    turns: int = 0  # prompts end at one of a conversation's first `turns` replies; 0: at any reply
    clean: bool = False  # with turns: a prompt holds its own conversation only, padded on the left (``PAD``)


def requested(args) -> DistillConfig:
    """The distillation a training command's options ask for (``--sequences``, ``--prompt-len``, ``--new-tokens``,
    ``--sample-fraction``, ``--distill-seed``: ``train drafter``, ``ar-drafter`` and ``refiner`` share them)."""
    return DistillConfig(
        sequences=args.sequences,
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        batch_size=args.distill_batch,
        sample_fraction=args.sample_fraction,
        seed=args.distill_seed,
        turns=args.turns,
        clean=args.clean_openings,
    )


def corpus_tokens(data: list[Path], tokenizer) -> np.ndarray:
    """Token ids of the training text: a ``train.bin`` directory (already tokenized) or plain text files."""
    if len(data) == 1 and (data[0] / "train.bin").exists():
        return load_tokens(data[0] / "train.bin").astype(np.int64)
    ids: list[int] = []
    for path in data:
        for block in path.read_text(encoding="utf-8").split("\n\n"):
            if block.strip():
                ids.extend(tokenizer(block.strip() + "\n\n")["input_ids"])
    return np.asarray(ids, dtype=np.int64)


def reply_marker(tokenizer) -> list[int]:
    """The tokens a chat template puts before an assistant reply (``<|assistant|>`` for the project's own,
    ``<|im_start|>assistant\\n`` for ChatML): what a generation prompt adds to a conversation. Empty without a
    template."""
    if tokenizer.chat_template is None:
        return []
    chat = [{"role": "user", "content": "x"}]
    plain = tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=False)
    prompted = tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)
    plain, prompted = (list(getattr(ids, "input_ids", ids)) for ids in (plain, prompted))
    return prompted[len(plain) :] if prompted[: len(plain)] == plain else []


def conversation_opening(tokenizer) -> list[int]:
    """The tokens every conversation the chat template renders starts with (for SmolLM2 its default system turn
    and ``<|im_start|>user\n``): what tells where one conversation of the corpus ends and the next begins."""
    first, second = (
        list(getattr(ids, "input_ids", ids))
        for ids in (
            tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True)
            for text in ("a", "zebra?")
        )
    )
    common = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))
    return first[:common]


def occurrences(tokens: np.ndarray, pattern: list[int]) -> np.ndarray:
    """Positions right after each occurrence of ``pattern`` in ``tokens``."""
    n = len(pattern)
    windows = np.lib.stride_tricks.sliding_window_view(tokens, n)
    return np.nonzero((windows == np.asarray(pattern)).all(axis=1))[0] + n


def conversation_starts(tokens: np.ndarray, opening: list[int]) -> np.ndarray:
    """Where each conversation of the corpus starts: its opening's first token."""
    found = occurrences(tokens, opening) - len(opening) if opening else np.zeros(0, dtype=np.int64)
    if found.size == 0:
        raise XpressError("the chat template renders no opening to find conversations by: distill without --turns")
    return found


def early_replies(ends: np.ndarray, starts: np.ndarray, turns: int) -> np.ndarray:
    """The ``ends`` among their conversation's first ``turns`` replies. Why: a reply deep in a corpus dialogue
    follows the corpus's own assistant turns, while the app's and the bench's conversations start with a user turn
    and hold the target's own replies; the target answers a conversation's opening in another style (SmolLM2: "I'm
    sorry for any confusion, but as a chatbot..."), which those windows rarely show the drafter."""
    conversation = np.searchsorted(starts, ends, side="right")  # 0: before the first conversation's start
    first_of = np.searchsorted(conversation, conversation, side="left")  # ends are sorted: each one's first end
    rank = np.arange(ends.size) - first_of
    return ends[(rank < turns) & (conversation > 0)]


def check_clean(turns: int, clean: bool) -> None:
    """``--clean-openings`` finds conversations as ``--turns`` does: refused without it."""
    if clean and not turns:
        raise XpressError("--clean-openings keeps a conversation's first replies: give --turns 1 or more with it")


def prompt_ends(tokens: np.ndarray, tokenizer, prompt_len: int, turns: int = 0, clean: bool = False) -> np.ndarray:
    """Where prompts end: right after a reply's opening marker when the tokenizer's chat template has one (the
    drafter then learns replies, what the app asks of it), else every position; ``turns`` > 0 keeps a
    conversation's first ``turns`` replies (``early_replies``); ``clean`` only those whose whole conversation up to
    there fits in ``prompt_len`` tokens."""
    first = prompt_len
    marker = reply_marker(tokenizer)
    if turns and (turns < 0 or not marker):
        raise XpressError(f"--turns counts a chat template's replies: 1 or more with one, else 0; got {turns}")
    check_clean(turns, clean)
    if marker:
        ends = occurrences(tokens, marker)
        if turns:
            starts = conversation_starts(tokens, conversation_opening(tokenizer))
            ends = early_replies(ends, starts, turns)
        ends = ends[(ends >= first) & (ends < tokens.size)]
        if clean:
            ends = ends[ends - own_starts(starts, ends) <= prompt_len]
        if ends.size:
            return ends
        if turns:  # every position would distil mid-turn text the option was asked to leave out
            raise XpressError(f"no conversation's first {turns} replies end {prompt_len} tokens or more into the text")
    return np.arange(first, tokens.size)


@torch.no_grad()
def continue_batch(target, prompts: torch.Tensor, new_tokens: int, temperature: float, generator) -> torch.Tensor:
    """(B, P) -> (B, P + new_tokens), greedy (temperature 0) or sampled, with the KV cache.

    No end-of-sequence stop: past an end-of-turn the target goes on with the next turn, still its own distribution,
    and every row keeps the same length (the drafter also learns to predict the end-of-turn token itself).
    """
    cache = new_cache(target)
    ids, mask = unpadded(prompts)
    masked = {} if mask is None else {"attention_mask": mask}
    logits = target(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1, **masked).logits[:, -1]
    out = [prompts]
    for _ in range(new_tokens):
        if temperature > 0:
            probs = (logits.float() / temperature).softmax(-1)
            token = torch.multinomial(probs, 1, generator=generator)
        else:
            token = logits.argmax(-1, keepdim=True)
        out.append(token)
        if mask is not None:
            masked["attention_mask"] = mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        logits = target(input_ids=token, cache=cache, use_cache=True, **masked).logits[:, -1]
    return torch.cat(out, dim=1)


MANIFEST = "distill.json"


def distillation_record(out_dir: Path) -> dict | None:
    """The ``DistillConfig`` that wrote ``out_dir``'s chunks; None for a folder written before it was kept."""
    path = out_dir / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def claim_folder(out_dir: Path, cfg: DistillConfig) -> None:
    """Resume only what this config wrote: which chunks are sampled, and from which prompts, depends on all of it."""
    recorded, wanted = distillation_record(out_dir), asdict(cfg)
    if recorded is not None:  # a setting added since the folder was written: it was written at the default
        recorded = asdict(DistillConfig()) | recorded
    if recorded is not None and recorded != wanted:
        differ = ", ".join(f"{k} {recorded.get(k)} -> {v}" for k, v in wanted.items() if recorded.get(k) != v)
        raise XpressError(f"{out_dir} holds a distillation written with other settings ({differ}): use another folder")
    if recorded is None and not any(out_dir.glob("chunk_*.pt")):
        (out_dir / MANIFEST).write_text(json.dumps(wanted, indent=1))


# A position before a clean opening: no token. Rows holding it are read with an attention mask (``unpadded``).
PAD = -1


def own_starts(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Where the conversation of each of ``ends`` starts, of the corpus's ``starts`` (``conversation_starts``)."""
    return starts[np.maximum(np.searchsorted(starts, ends, side="right") - 1, 0)]


def prompt_windows(
    tokens: np.ndarray, ends: np.ndarray, prompt_len: int, device, starts: np.ndarray | None = None
) -> torch.Tensor:
    """(len(ends), prompt_len) the ``prompt_len`` tokens before each end, on ``device``; with ``starts`` (where each
    end's conversation starts) the tokens before a start are ``PAD``. Why clean: SmolLM2 answers a request after 40
    tokens of another conversation otherwise within its first 0-15 tokens in 12 of 12 chats, where the app and the bench
    ask with the conversation alone (with the pad masked out, 7 of 12 replies the same over 40 tokens, bf16)."""
    windows = np.stack([tokens[e - prompt_len : e] for e in ends])
    if starts is not None:
        before = np.arange(prompt_len)[None, :] < (starts - (ends - prompt_len))[:, None]
        windows = np.where(before, PAD, windows)
    return torch.from_numpy(windows).to(device)


def unpadded(seqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows as a model reads them: ``PAD`` replaced by token 0 under an attention mask that leaves it out (None where
    no row holds one). Positions run on under the pad: a rotary model's attention depends on their differences only."""
    pads = seqs == PAD
    if not pads.any():
        return seqs, None
    return seqs.masked_fill(pads, 0), (~pads).long()


@torch.no_grad()
def held_out_dialogue_rows(target, tokenizer, data: list[Path], rows: int, cfg: DistillConfig) -> torch.Tensor | None:
    """(rows, prompt_len + new_tokens) the target's greedy continuations of prompts from the corpus's validation
    dialogues (``val.bin``: SGD's dev split, which no training row comes from), or None without one. Why: the
    distillation's own held-out rows continue training dialogues, which the target and drafter learned: there the
    curve rose with training where decoding held-out chats did not."""
    if rows <= 0 or len(data) != 1 or not (data[0] / "val.bin").exists():
        return None
    tokens = load_tokens(data[0] / "val.bin").astype(np.int64)
    ends = prompt_ends(tokens, tokenizer, cfg.prompt_len, cfg.turns, cfg.clean)
    picks = np.random.default_rng(7).choice(ends, size=min(rows, ends.size), replace=False)
    starts = own_starts(conversation_starts(tokens, conversation_opening(tokenizer)), picks) if cfg.clean else None
    prompts = prompt_windows(tokens, picks, cfg.prompt_len, target.device, starts)
    return continue_batch(target, prompts, cfg.new_tokens, 0.0, None)


@torch.no_grad()
def write_distillation(target, tokenizer, data: list[Path], out_dir: Path, cfg: DistillConfig) -> Path:
    """Write ``chunk_*.pt`` files of (batch, prompt_len + new_tokens) int32 sequences; returns the directory."""
    out_dir.mkdir(parents=True, exist_ok=True)
    claim_folder(out_dir, cfg)
    tokens = corpus_tokens(data, tokenizer)
    ends = prompt_ends(tokens, tokenizer, cfg.prompt_len, cfg.turns, cfg.clean)
    chunks = -(-cfg.sequences // cfg.batch_size)
    device = target.device
    starts = conversation_starts(tokens, conversation_opening(tokenizer)) if cfg.clean else None  # one corpus scan
    for chunk in tqdm(range(chunks), desc="distill", mininterval=5):
        path = out_dir / f"chunk_{chunk:05d}.pt"
        if path.exists():
            continue  # resume
        rng = np.random.default_rng([cfg.seed, chunk])
        picks = rng.choice(ends, size=cfg.batch_size)
        prompts = prompt_windows(
            tokens, picks, cfg.prompt_len, device, None if starts is None else own_starts(starts, picks)
        )
        sample = chunk < chunks * cfg.sample_fraction
        generator = torch.Generator(device=device).manual_seed(cfg.seed * 100_003 + chunk)
        out = continue_batch(target, prompts, cfg.new_tokens, cfg.temperature if sample else 0.0, generator)
        torch.save(out.to(torch.int32).cpu(), path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)
    return out_dir


def load_distillation(out_dir: Path) -> torch.Tensor:
    files = sorted(out_dir.glob("chunk_*.pt"))
    if not files:
        raise FileNotFoundError(f"no distillation chunks in {out_dir}")
    return torch.cat([torch.load(f) for f in files]).long()
