"""Typed events of the decoding loop, their metrics, and the per-round JSONL log.

The engine yields one ``RoundTrace`` per round and ends with one ``DecodeResult``; the CLI, the benchmark and the app
all read this stream, so what they show is what the loop did.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import IO

import torch

from .records import json_record

MASKED = -1  # token id shown for a position the drafter has not committed yet


@dataclass(frozen=True)
class DenoiseStep:
    tokens: tuple[tuple[int, ...], ...]  # (K, L) committed tokens after this step, MASKED where still masked
    confidence: tuple[tuple[float, ...], ...]  # (K, L) drafter probability of each position's current best token
    # Gaussian drafter: the noise level t this step denoised (1 = pure noise); its tokens are every position's
    # nearest token (the LM head's argmax of the step's clean estimate), none masked. None for the masked drafter.
    noise_level: float | None = None
    # "denoise": a denoise step; "pass": a refinement pass (pass 0 the drafter's forward; refiner.py), whose tokens
    # the panel compares with the pass before; "tree": a draft tree (with a refiner head, one per pass: refined along
    # its own paths).
    kind: str = "denoise"


@dataclass(frozen=True)
class Refinement:
    """What a round's refinement passes did (a drafter with a refiner head, T >= 2: docs/DESIGN.md §3.5), kept every
    round, watched or not, so that a reply can say what the passes bought (``verdict.refinement_gain``)."""

    # Pass 0's drafts, what the round would have verified without passes: K rows, or the paths of the T = 1 tree.
    before: tuple[tuple[int, ...], ...]
    after: tuple[tuple[int, ...], ...]  # the drafts after the last pass: the rows refined, or the refined tree's paths


def tokens_per_round(accept_lens: Sequence[int]) -> float:
    """tau: tokens emitted per drafting round (accepted + the target's own token), pooled over the rounds given."""
    return (sum(accept_lens) + len(accept_lens)) / len(accept_lens) if accept_lens else 0.0


@dataclass(frozen=True)
class RoundTrace:
    index: int  # 0 is the prefill (no drafting)
    steps: tuple[DenoiseStep, ...]  # T denoise steps; empty for the prefill and the "none" drafter
    drafts: tuple[tuple[int, ...], ...]  # (K, L) final drafts
    tree_tokens: tuple[int, ...]  # trie nodes, root first
    tree_parents: tuple[int, ...]
    draft_accept_lens: tuple[int, ...]  # per draft: tokens on the accepted path
    accepted: tuple[int, ...]  # accepted draft tokens (the chosen path)
    emitted: tuple[int, ...]  # tokens this round adds to the output (accepted + the target's own), after trimming
    draft_s: float
    verify_s: float
    other_s: float  # accept + commit + stop checks
    new_tokens_total: int  # output length after this round
    elapsed_s: float  # since the request started
    peak_mem_mb: float
    cache_len: int  # target KV cache length after the round (committed tokens - 1 while decoding goes on)
    draft_context_len: int  # the drafter's context length after the round (kept equal to cache_len)
    setting: tuple[int, int, int] = (0, 0, 0)  # (K, T, L) drafted this round; L = 0: a plain step (and the prefill)
    refinement: Refinement | None = None  # None: no refinement passes ran (T = 1, no refiner head, a plain step)

    @property
    def accept_len(self) -> int:
        return len(self.accepted)

    @property
    def tree_size(self) -> int:
        return max(0, len(self.tree_tokens) - 1)

    @property
    def tokens_per_s(self) -> float:
        """Output speed of the request so far."""
        return self.new_tokens_total / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class DecodeResult:
    text: str
    token_ids: tuple[int, ...]  # new tokens only
    rounds: int  # drafting rounds (the prefill not counted)
    accept_lens: tuple[int, ...]  # per drafting round
    time_s: float
    draft_s: float
    verify_s: float
    other_s: float
    prefill_s: float
    peak_mem_mb: float
    stop_reason: str  # "eos", "stop_string", "max_new_tokens"
    target_forwards: int
    settings: tuple[tuple[int, int, int], ...] = ()  # per drafting round: (K, T, L), L = 0 for a plain step
    dtype: str = "float32"  # the dtype the models ran in (exactness: docs/DESIGN.md §2.5)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tau(self) -> float:
        """Tokens emitted per drafting round (accepted + the target's own token)."""
        return tokens_per_round(self.accept_lens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.time_s if self.time_s > 0 else 0.0

    def to_json(self) -> dict:
        return json_record(
            {
                "text": self.text,
                "token_ids": self.token_ids,
                "new_tokens": self.new_tokens,
                "rounds": self.rounds,
                "tau": self.tau,
                "mean_accept_len": self.tau,  # the same tau under its earlier name, which scripts read
                "accept_lens": self.accept_lens,
                "tokens_per_s": self.tokens_per_s,
                "time_s": self.time_s,
                "prefill_s": self.prefill_s,
                "draft_s": self.draft_s,
                "verify_s": self.verify_s,
                "other_s": self.other_s,
                "peak_mem_mb": self.peak_mem_mb,
                "target_forwards": self.target_forwards,
                "stop_reason": self.stop_reason,
                "settings": self.settings,
                "dtype": self.dtype,
            }
        )


def cuda_devices(*modules) -> tuple[torch.device, ...]:
    """The CUDA devices the parameters of ``modules`` live on (None and non-modules skipped): every GPU of a target
    spread by ``device_map``."""
    found = {
        p.device for m in modules if isinstance(m, torch.nn.Module) for p in m.parameters() if p.device.type == "cuda"
    }
    return tuple(sorted(found, key=str))


def peak_memory_mb(devices: Iterable[torch.device]) -> float:
    """CUDA: the peak allocated by torch, summed over the devices given (a target spread over GPUs); none given (a
    CPU): the process's peak resident set size."""
    cuda = [d for d in devices if d.type == "cuda"]
    if cuda:
        return sum(torch.cuda.max_memory_allocated(d) for d in cuda) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # macOS reports bytes, Linux KiB


class StageClock:
    """The stage boundaries of a round (``mark``) and the seconds between them (``seconds``), on a clock that stops
    while the consumer holds a yielded event (``paused``), so UI rendering never counts as decoding time.

    On CUDA a mark is an event recorded on the device's stream and costs no wait: a round's marks are read after one
    wait for the last of them, which every earlier one precedes (docs/DESIGN.md §2). Elsewhere a mark is the wall
    clock. A stage lasts from when the device reached one mark to when it reached the next: the host's own work
    between them when the device waits for it, the device's when the host is ahead.

    A target spread over GPUs (``devices``: every CUDA device the models use) is marked on each: an event on every
    other device's stream, which ``device``'s stream then waits for (on the device, not the host) before its own
    timing event, so that a mark is reached once every device has done the work queued before it. The wait orders
    ``device``'s later work after the others' earlier work, which a spread model's stages are anyway (each reads the
    one before's output)."""

    host_time = staticmethod(time.perf_counter)  # lab.profile_round swaps in the CPU time

    def __init__(self, device: torch.device, events: bool | None = None, devices=()):
        self.device = device
        self.events = device.type == "cuda" if events is None else events
        self.others = tuple(d for d in devices if d != device)
        self.excluded = 0.0

    def mark(self):
        if not self.events:
            return self.host_time()
        stream = torch.cuda.current_stream(self.device)
        for other in self.others:
            reached = torch.cuda.Event()
            reached.record(torch.cuda.current_stream(other))
            stream.wait_event(reached)
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def seconds(self, *marks) -> list[float]:
        """The seconds between consecutive marks; on CUDA after the one wait of the round (for the last mark)."""
        if not self.events:
            return [b - a for a, b in pairwise(marks)]
        marks[-1].synchronize()
        return [a.elapsed_time(b) / 1000.0 for a, b in pairwise(marks)]

    def now(self) -> float:
        """Host seconds, the paused ones excluded (the device's work included once ``seconds`` waited for it)."""
        return self.host_time() - self.excluded

    @contextmanager
    def paused(self):
        t = self.host_time()
        yield
        self.excluded += self.host_time() - t


def round_log_record(trace: RoundTrace) -> dict:
    return json_record(
        {
            "round": trace.index,
            "K": trace.setting[0],
            "T": trace.setting[1],
            "L": trace.setting[2],
            "draft_time": trace.draft_s,
            "verify_time": trace.verify_s,
            "other_time": trace.other_s,
            "accept_len": trace.accept_len,
            "draft_accept_lens": trace.draft_accept_lens,
            "accepted_tokens": trace.accepted,
            "emitted_tokens": trace.emitted,
            "tree_size": trace.tree_size,
            "tokens_per_s": trace.tokens_per_s,
            "memory_mb": trace.peak_mem_mb,
            "refinement": None if trace.refinement is None else asdict(trace.refinement),
        }
    )


def write_jsonl(traces: list[RoundTrace], out: Path | IO[str]) -> None:
    lines = "".join(json.dumps(round_log_record(t)) + "\n" for t in traces)
    if isinstance(out, Path):
        out.write_text(lines)
    else:
        out.write(lines)
