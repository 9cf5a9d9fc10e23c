"""A round as a GPU runs it, checked on the CPU: the host-device synchronizations a round makes (counted by
``tests/host_syncs.py``, itself checked on code whose syncs are known), logits computed only where read, the
attention implementation checked at load, peak memory and waits over the models' devices."""

from __future__ import annotations

import functools
import random

import pytest
import torch
from transformers import AutoTokenizer

from tests.host_syncs import HostSyncs, round_syncs
from tests.tiny import make_a2d_drafter, make_dflash_drafter, make_masked_lm
from xpress_core import engine
from xpress_core.config import DecodeConfig
from xpress_core.controller import CostModel
from xpress_core.drafters.layer_masks import sees_everything
from xpress_core.errors import XpressError
from xpress_core.head import PLAIN_HEAD, HeadRows, check_head, plain_head
from xpress_core.models import check_tree_attention, encode_prompt, load_models, load_target
from xpress_core.sampling import TargetNoise, draw_token
from xpress_core.trace import StageClock, peak_memory_mb
from xpress_core.tree import best_first_on_device, best_first_tree, read_trees, to_device

PROMPT = "Book a table for two tonight."


def test_the_counter_counts_what_cuda_would_wait_on():
    """Each line's syncs are known: reads of device tensors, blocking copies to the device, index tensors made on the
    host, and the CUDA waits; host tensors and a non-blocking copy cost none."""
    with HostSyncs() as syncs:
        x = torch.arange(4.0, device="cpu")  # a device tensor (made with a device)
        host = torch.tensor([1.0, 2.0])  # a host tensor
        steps = []
        for line in (
            lambda: x.sum().item(),
            lambda: x.tolist(),
            lambda: bool(x.any()),
            lambda: int(x[0]),
            lambda: x.nonzero(),
            lambda: x[x > 1],
            lambda: x[[0, 2]],
            lambda: torch.tensor([1, 2], device="cpu"),
            lambda: host.to("cpu"),
            lambda: x.cpu(),
            lambda: torch.cuda.synchronize(),
        ):
            before = syncs.total
            line()
            steps.append(syncs.total - before)
        assert steps == [1] * 11
        before = syncs.total
        host.sum().item(), host.tolist(), float(host[0])  # the host reads its own memory
        sent = host.to("cpu", non_blocking=True)
        sent.sum()
        x[torch.arange(2, device="cpu")]  # an index already on the device
        assert syncs.total == before and syncs.transfers == 1 and syncs.mixed == 0, syncs.log[11:]
        x + torch.ones(4)  # a host tensor in a device op: CUDA would refuse it
        assert syncs.mixed == 1


def test_the_counter_sees_a_wait_per_token_and_cuda_events_complete_only_after_a_wait():
    noise = TargetNoise(torch.Generator().manual_seed(0), 8)
    logits = torch.randn(5, 8, device="cpu")
    with HostSyncs() as syncs:
        tokens = [draw_token(row, DecodeConfig(), noise) for row in logits]  # the old acceptance: a read per token
        assert syncs.total == 5 and tokens == logits.argmax(-1).tolist()
        clock = StageClock(torch.device("cpu"), events=True)
        a, b = clock.mark(), clock.mark()
        with pytest.raises(RuntimeError, match="not completed"):
            a.elapsed_time(b)
        before = syncs.total
        assert len(clock.seconds(a, b)) == 1 and syncs.total == before + 1  # one wait for both


def refiner_drafter(zoo, out):
    from xpress_core.drafters.diffusion_model import XpressDrafter
    from xpress_core.train.refiner import attach_refiner

    drafter = attach_refiner(XpressDrafter.from_pretrained(zoo["drafter_llama"]), 16)
    torch.manual_seed(7)
    with torch.no_grad():
        for p in drafter.refiner.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    drafter.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def drafters(zoo, tmp_path_factory):
    """Every drafter kind, with its target: (target, drafter) paths by name."""
    root = tmp_path_factory.mktemp("kinds")
    tok = AutoTokenizer.from_pretrained(zoo["tokenizer"])
    found = {
        "diffusion": (zoo["llama"], zoo["drafter_llama"]),
        "gaussian": (zoo["llama"], zoo["gauss_llama"]),
        "refiner": (zoo["llama"], refiner_drafter(zoo, root / "head")),
        "dflash": (zoo["qwen3"], make_dflash_drafter(zoo["qwen3"], root / "dflash")),
        "autoregressive": (zoo["llama"], zoo["ar_drafter"]),
        "diffusion-lm": (zoo["llama"], make_masked_lm(tok, root / "bert")),
        "diffusion-lm-a2d": (zoo["llama"], make_a2d_drafter(tok, root / "a2d")),
        "none": (zoo["llama"], "none"),
    }
    try:
        from tests.reference import Variant, make_reference_drafter

        found["dflash2"] = (
            zoo["qwen3"],
            make_reference_drafter(Variant("d2", kind="dflash2"), zoo["qwen3"], root / "d2"),
        )
    except ImportError:  # the DFlash reference package is a test requirement; without it, DFlash 2 is not covered
        pass
    return found


TREE = DecodeConfig(drafts=4, block=8, max_new_tokens=12)
CASES = [
    ("diffusion", TREE),
    ("diffusion", DecodeConfig(drafts=4, block=8, temperature=0.8, top_p=0.9, top_k=20, max_new_tokens=12)),
    ("diffusion", DecodeConfig(drafts=3, steps=3, block=6, diversity="branch-uncertain", max_new_tokens=12)),
    ("diffusion", DecodeConfig(drafts=3, block=6, diversity="branch-first", verify="batch", max_new_tokens=12)),
    ("diffusion", DecodeConfig(drafts=2, steps=2, block=4, refine="serial", diversity="gumbel", max_new_tokens=12)),
    ("diffusion", DecodeConfig(auto=True, max_new_tokens=12)),
    ("gaussian", DecodeConfig(drafts=2, steps=2, block=6, diversity="none", max_new_tokens=12)),
    ("refiner", DecodeConfig(drafts=4, steps=3, block=8, max_new_tokens=12)),
    ("refiner", DecodeConfig(drafts=4, steps=2, block=6, temperature=0.8, max_new_tokens=12)),
    ("refiner", DecodeConfig(drafts=3, steps=3, block=8, diversity="branch-first", max_new_tokens=12)),
    ("dflash", TREE),
    ("dflash2", DecodeConfig(drafts=4, block=4, max_new_tokens=12)),
    ("autoregressive", DecodeConfig(drafts=2, block=4, max_new_tokens=12)),
    ("autoregressive", DecodeConfig(drafts=2, block=4, temperature=0.7, refine="serial", max_new_tokens=12)),
    ("diffusion-lm", TREE),
    ("diffusion-lm-a2d", DecodeConfig(drafts=2, steps=2, block=4, diversity="branch-first", max_new_tokens=12)),
    ("none", DecodeConfig(max_new_tokens=12)),
]


@pytest.mark.parametrize("kind,cfg", CASES)
def test_a_round_waits_for_the_device_at_most_three_times(drafters, monkeypatch, kind, cfg):
    """Counted as a CUDA device would make them (``HostSyncs``), the stage clock on CUDA events: the drafts read
    once, the target's draws read once, the clock's one wait; refinement passes run on the device (no read
    between them: rows, and a refined tree built there). The tokens are those of the CPU's round (draws node by node,
    the wall clock): the draws at once are the walk's, greedy and sampled."""
    if kind not in drafters:
        pytest.skip("the DFlash reference package is not installed")
    models = load_models(*drafters[kind], device="cpu", dtype="float32")
    ids = encode_prompt(models.tokenizer, PROMPT, chat=True)
    # auto plans with costs that make drafting pay (a draft forward a tenth of a verify), measured by nobody
    costs = CostModel(0.0001, 0.0, 0.001, 0.00001, 0.0001) if cfg.auto else None
    want = list(engine.decode(models, ids, cfg, costs=costs))[-1].token_ids  # a CPU's walk: node by node
    # A GPU's round: the stage clock on CUDA events, the target's draws at every node at once
    monkeypatch.setattr(engine, "StageClock", functools.partial(StageClock, events=True))
    monkeypatch.setattr("xpress_core.tree.draws_at_once", lambda device: True)
    monkeypatch.setattr("xpress_core.drafters.diffusion.reads_between_passes", lambda device: False)
    monkeypatch.setattr("xpress_core.drafters.base.one_transfer", lambda device: True)
    events = []
    with HostSyncs() as syncs:
        syncs.host(ids)  # a tokenizer's ids are on the host
        prefill, *rounds, _ = round_syncs(engine.decode(models, ids, cfg, costs=costs), syncs, events)
    assert events[-1].token_ids == want
    assert prefill[0] <= 2, prefill
    assert len(rounds) >= 2 and all(r[0] <= 3 for r in rounds), rounds
    assert syncs.mixed == 0, [e for e in syncs.log if e.startswith("mixed")]


def test_the_prefill_and_the_autoregressive_drafter_compute_the_lm_head_at_the_last_position_only(drafters):
    models = load_models(*drafters["autoregressive"], device="cpu", dtype="float32")
    ids = encode_prompt(models.tokenizer, PROMPT, chat=True)
    rows = []
    for model in (models.target, models.drafter.model):
        model.get_output_embeddings().register_forward_hook(lambda m, args, out: rows.append(args[0].shape[1]))
    engine.decode_to_end(models, ids, DecodeConfig(drafts=2, block=3, max_new_tokens=2))
    assert ids.shape[1] > 1 and rows[:2] == [1, 1]  # the prompt through the target, then the drafter: one position


def test_a_verify_computes_the_lm_head_at_the_nodes_the_walk_reads_only(drafters, monkeypatch):
    """On a CPU the walk reads a node's logits when it reaches it: the root and the first draft together, then each
    node past them; the tree's other nodes never pass the head, and the forward itself runs it over no position. The
    tokens are the full head's (a target left unmarked computes every node's logits)."""
    models = load_models(*drafters["diffusion"], device="cpu", dtype="float32")
    ids = encode_prompt(models.tokenizer, PROMPT, chat=True)
    assert plain_head(models.target)
    trees, computed = [], []  # per verify: (nodes, the first block's rows), rows its walk computed
    original = HeadRows.__init__

    def counted(self, target, hidden, first):
        original(self, target, hidden, first)
        trees.append((hidden.shape[0], first))
        computed.append(0)
        head = self.head

        def counting_head(rows):
            computed[-1] += rows.shape[0]
            return head(rows)

        self.head = counting_head

    monkeypatch.setattr(HeadRows, "__init__", counted)
    lazy = engine.decode_to_end(models, ids, TREE)
    assert len(trees) == lazy.rounds
    for (nodes, first), rows, accepted in zip(trees, computed, lazy.accept_lens):
        assert first <= rows <= first + accepted + 1 and rows < nodes
    assert sum(computed) < sum(nodes for nodes, _ in trees) / 2
    monkeypatch.undo()
    setattr(models.target, PLAIN_HEAD, False)
    assert engine.decode_to_end(models, ids, TREE).token_ids == lazy.token_ids


def test_a_target_whose_logits_are_transformed_after_the_head_keeps_its_full_head(zoo):
    """Soft-capped or scaled logits are not the head's product: such a target computes its logits itself."""
    target, _ = load_target(zoo["llama"], torch.device("cpu"), torch.float32)
    assert plain_head(target)
    target.config.final_logit_softcapping = 5.0
    delattr(target, PLAIN_HEAD)
    check_head(target)
    assert not plain_head(target)


def test_the_diffusion_lm_drafter_computes_logits_over_its_block_only_and_builds_no_cache(drafters):
    models = load_models(*drafters["diffusion-lm-a2d"], device="cpu", dtype="float32")
    ids = encode_prompt(models.tokenizer, PROMPT, chat=True)
    calls = []
    drafter = models.drafter.model
    drafter.get_output_embeddings().register_forward_hook(lambda m, args, out: calls.append(args[0].shape[1]))
    drafter.register_forward_hook(lambda m, args, kwargs, out: calls.append(out.past_key_values), with_kwargs=True)
    engine.decode_to_end(models, ids, DecodeConfig(drafts=2, steps=2, block=5, max_new_tokens=6))
    assert calls and calls[0::2] == [6] * (len(calls) // 2)  # the block and the position before it
    assert all(cache is None for cache in calls[1::2])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 1, 2, 3, 5, 9])
def test_which_drafter_layers_see_everything_is_decided_on_the_host_as_the_mask_would(causal, window):
    for keys in range(1, 10):
        for q_len in range(1, keys + 1):
            query = torch.arange(keys - q_len, keys)[:, None]
            key = torch.arange(keys)[None]
            visible = torch.ones(q_len, keys, dtype=torch.bool)
            if causal:
                visible &= key <= query
            if window is not None:
                visible &= query - key < window
                if not causal:
                    visible &= key - query < window
            assert sees_everything(causal, window, q_len, keys) == bool(visible.all()), (keys, q_len)


@pytest.mark.parametrize("implementation", ["flash_attention_2", "flash_attention_3", "paged|sdpa", "flex_attention"])
def test_a_target_whose_attention_would_ignore_the_tree_mask_is_refused_at_load(zoo, monkeypatch, implementation):
    """No flash_attn needed: the check reads the loaded config's ``_attn_implementation``."""
    target, _ = load_target(zoo["llama"], torch.device("cpu"), torch.float32)  # sdpa: accepted
    check_tree_attention(target.config)
    target.config._attn_implementation = implementation
    with pytest.raises(XpressError, match=f"{implementation!r} ignores the tree attention mask"):
        check_tree_attention(target.config)
    loaded = type(target).from_pretrained

    def with_implementation(*args, **kwargs):
        model = loaded(*args, **kwargs)
        model.config._attn_implementation = implementation
        return model

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", with_implementation)
    with pytest.raises(XpressError, match="ignores the tree attention mask"):
        load_models(zoo["llama"], "none", device="cpu", dtype="float32")


def test_peak_memory_sums_the_devices_given_and_waits_wait_for_those_only(monkeypatch):
    gpus = (torch.device("cuda:0"), torch.device("cuda:2"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: {0: 2**20, 2: 3 * 2**20}[d.index])
    assert peak_memory_mb(gpus) == 4.0
    assert peak_memory_mb(()) > 0  # a CPU: the process's peak resident set
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)
    engine.wait_for_gpus(gpus)
    assert waited == list(gpus)


@pytest.mark.parametrize("seed", range(6))
def test_a_tree_built_on_the_device_is_the_hosts_best_first_tree_bit_for_bit(seed):
    """``best_first_on_device`` against the host's heap (``best_first_tree``) on the same choices: each node's
    children's chances drawn from eighths (exact products: ties across depths, siblings and cousins) and zeros, and
    fewer children than the budget; the same paths, chances and order, every budget and depth."""
    rng = random.Random(seed)
    width = rng.randint(2, 4)

    def choices(path: tuple[int, ...]) -> tuple[list[float], list[int]]:
        law = random.Random(f"{seed} {path}")
        return sorted((law.randint(0, 8) / 8 for _ in range(width)), reverse=True), law.sample(range(9), width)

    def on_device(paths: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [choices(tuple(row[:d])) for row in paths.tolist()]
        return torch.tensor([r[0] for r in rows], dtype=torch.float32), torch.tensor([r[1] for r in rows])

    for budget in range(1, 14):
        for depth in range(1, 5):
            want = best_first_tree(choices, budget, depth)
            [got] = read_trees([best_first_on_device(on_device, budget, depth, "cpu")])
            assert (got.tokens, got.chances, got.order) == (want.tokens, want.chances, want.order), (budget, depth)


def test_python_ints_go_to_the_device_in_one_copy():
    with HostSyncs() as syncs:
        sent = to_device([[1, 2, 3], [4, 5, 6]], "cpu")
    assert sent.tolist() == [[1, 2, 3], [4, 5, 6]] and sent.dtype == torch.long
    assert syncs.total == 0 and syncs.transfers == 1


def test_calibrations_clock_waits_for_the_models_gpus_only(zoo, monkeypatch):
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu", dtype="float32")
    gpus = (torch.device("cuda:1"), torch.device("cuda:3"))
    monkeypatch.setitem(models.__dict__, "cuda_devices", gpus)  # as a target spread over two of four GPUs
    assert engine.CalibrationRun(models).clock.devices == gpus
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    engine.Clock(torch.device("cuda:1"), gpus).now()
    assert waited == list(gpus)


def test_a_stage_mark_over_several_gpus_is_reached_once_every_gpu_reached_it():
    """Each other device records an event, which the first device's stream waits for before its timing event: the
    marks are timed on one device (CUDA times events of one device only), after every device's earlier work, with
    no wait of the host but the round's one."""
    first, second, third = (torch.device(f"cuda:{i}") for i in range(3))
    with HostSyncs() as syncs:
        clock = StageClock(first, events=True, devices=(first, second, third))
        a, b = clock.mark(), clock.mark()
        assert syncs.total == 0
        assert len(clock.seconds(a, b)) == 1 and syncs.total == 1
        streams = syncs.streams
    assert set(streams) == {"cuda:0", "cuda:1", "cuda:2"}
    ones, twos = ([event for op, event in streams[d].log if op == "record"] for d in ("cuda:1", "cuda:2"))
    assert len(ones) == len(twos) == 2 and all(op == "record" for d in ("cuda:1", "cuda:2") for op, _ in streams[d].log)
    # on the first device, per mark: a wait for each other device's event of that mark, then the timed event
    assert streams["cuda:0"].log == [
        ("wait", ones[0]),
        ("wait", twos[0]),
        ("record", a),
        ("wait", ones[1]),
        ("wait", twos[1]),
        ("record", b),
    ]
    assert a.device == b.device == "cuda:0"
    alone = StageClock(first, events=True, devices=(first,))
    assert alone.others == ()
    with HostSyncs() as syncs, pytest.raises(RuntimeError, match="two devices"):
        x, y = StageClock(first, events=True).mark(), StageClock(second, events=True).mark()
        torch.cuda.synchronize()
        x.elapsed_time(y)
