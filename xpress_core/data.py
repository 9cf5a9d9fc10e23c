"""The data folder and what reads it: where the data lives, its dialogue and story readers, and the held-out
prompts the benchmark, the app's Sweep tab and ``train eval`` measure on (never trained on). The benchmark's and the
Sweep's prompt sets ship in ``xpress_core/prompts/`` (derived from the data folder by ``scripts/make_prompts.py``), so
that a clone with no data folder beside it (a Space, a laptop) measures the same prompts.

Neutral ground: the benchmark, the training pipeline and the app all import it; it imports none of them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .chat import FittedPrompt, fit_prompt
from .errors import XpressError

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


PROMPTS = Path(__file__).resolve().parent / "prompts"


# Where each corpus of the data folder comes from, and the plain-text layout the readers below expect: what a user
# without the folder fetches (``missing_data``). The public sources, with the licences the model cards name.
DATA_SOURCES = """\
  sgd/sgd_train.txt, sgd/sgd_dev.txt: Schema-Guided Dialogue (CC BY-SA 4.0), the train and dev splits of
    https://github.com/google-research-datasets/dstc8-schema-guided-dialogue (git clone); each dialogue's turns one a
    line, 'User: ...' (speaker USER) or 'Assistant: ...' (SYSTEM), a blank line between dialogues
  topical_chat/topical_chat_AB.txt: Topical-Chat (CDLA-Sharing-1.0), the validation and test conversations of
    https://github.com/alexa/Topical-Chat (git clone; conversations/*.json), 'A: ...' (agent_1) or 'B: ...'
    (agent_2) a line, a blank line between conversations
  tinystories/tinystories_a.txt, tinystories/tinystories_b.txt: TinyStories (CDLA-Sharing-1.0), the Hugging Face
    dataset roneneldan/TinyStories (datasets.load_dataset("roneneldan/TinyStories")): about 2 MB of the train split,
    stories separated by <|endoftext|>, and about 0.8 MB of the validation split, a blank line between stories"""


def missing_data(data_dir: Path, needed: Sequence[Path]) -> XpressError | None:
    """The error for a data folder without the ``needed`` files (relative to it): which ones, and where to get them."""
    missing = [str(name) for name in needed if not (data_dir / name).exists()]
    if not missing:
        return None
    return XpressError(
        f"the data folder {data_dir} lacks {', '.join(missing)}: fetch the datasets and lay them out as below, in "
        f"{DEFAULT_DATA} (beside the clone) or in a folder passed as --data DIR\n{DATA_SOURCES}"
    )


Chat = list[dict[str, str]]


_TURN = re.compile(r"^(User|Assistant|A|B):\s?(.*)$")
_ROLE = {"User": "user", "Assistant": "assistant", "A": "user", "B": "assistant"}


def read_dialogues(path: Path) -> Iterator[Chat]:
    """Blank-line separated dialogues, one ``Speaker: text`` turn a line."""
    chat: Chat = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _TURN.match(line.strip())
        if match:
            chat.append({"role": _ROLE[match.group(1)], "content": match.group(2).strip()})
        elif not line.strip() and chat:
            yield chat
            chat = []
    if chat:
        yield chat


def read_stories(path: Path) -> Iterator[str]:
    """TinyStories files: stories separated by ``<|endoftext|>`` or blank lines (part b)."""
    text = path.read_text(encoding="utf-8")
    parts = text.split("<|endoftext|>") if "<|endoftext|>" in text else re.split(r"\n\s*\n", text)
    for part in parts:
        story = part.strip()
        if len(story) > 40:
            yield story


# Default prompts (docs/DESIGN.md §5.2): 50 held-out sgd_dev chats, spread over the file (it is grouped by domain),
# each cut after its second user turn so the reply has context to continue (and prompt lookup something to copy),
# plus story requests phrased unlike the training ones.
SGD_DEV = Path("sgd") / "sgd_dev.txt"


SGD_PROMPTS = 50


SHORT_CHATS = 20  # the benchmark's single-turn chats (``short_chat``), beside the 50 longer ones


QUICK_PROMPTS = (2, 2, 2)  # (sgd chats, story requests, short chats) in ``bench --quick``


SGD_CONTEXT_TURNS = 3


HELD_OUT_STORIES = (
    "Write a short story about a puppy who is afraid of the rain.",
    "Tell me a story about a girl named Mia and her red kite.",
    "Can you tell me a story about a dragon who wants to be friends?",
    "Please write a bedtime story about the moon and a little owl.",
    "Tell me a story where a boy finds a magic box in the garden.",
    "Write a story about two friends who build a boat.",
    "Tell me a short story about a cat who loves to bake.",
    "Please tell me a story about a tree that can talk.",
    "Can you write a story for kids about a lost teddy bear?",
    "Tell me a happy story about a fish who learns to sing.",
)


# Story requests for fitting a drafter's settings (``fitting_prompts``): like the held-out ones, none of them.
FITTING_STORIES = (
    "Write a story about a little bird who cannot fly yet.",
    "Tell me a story about a boy and his blue ball.",
    "Can you tell me a story about a bunny who is very shy?",
    "Please write a story about a bear who loves honey.",
    "Tell me a story where a girl finds a shiny stone.",
    "Write a short story about a duck and a frog at the pond.",
    "Tell me a story about a little car that wants to go fast.",
    "Please tell me a story about a snowman in the sun.",
    "Can you write a story for kids about a brave little mouse?",
    "Tell me a funny story about a dog who eats a cake.",
)


@dataclass(frozen=True)
class Prompt:
    name: str
    content: str | tuple[tuple[str, str], ...]  # raw text, or chat messages as (role, content)
    chat: bool

    def ids(self, tokenizer, limit: int | None = None, max_new_tokens: int = 0) -> torch.Tensor:
        """(1, n) prompt ids, the chat template applied for chat prompts, fitted like every prompt (``fitted``)."""
        return self.fitted(tokenizer, limit, max_new_tokens).ids

    def fitted(self, tokenizer, limit: int | None = None, max_new_tokens: int = 0) -> FittedPrompt:
        """Within the shared caps and the target's context ``limit`` with room for ``max_new_tokens``."""
        if isinstance(self.content, str):
            return fit_prompt(tokenizer, self.content, self.chat, limit, max_new_tokens)
        return fit_prompt(tokenizer, [{"role": r, "content": c} for r, c in self.content], True, limit, max_new_tokens)


def default_prompts(
    data_dir: Path, sgd: int = SGD_PROMPTS, stories: int = len(HELD_OUT_STORIES), short: int = 0
) -> tuple[Prompt, ...]:
    """``sgd`` held-out chats cut after their second user turn, ``short`` single-turn ones (``short_chat``), then
    ``stories`` story requests."""
    dialogues = dev_dialogues(data_dir)
    chats = [dev_chat(i, dialogues[i]) for i in default_chat_indices(len(dialogues), sgd)]
    shorts = [short_chat(i, dialogues[i]) for i in default_chat_indices(len(dialogues), short)] if short else []
    return tuple(chats) + tuple(shorts) + story_prompts(stories)


def default_chat_indices(dialogues: int, sgd: int = SGD_PROMPTS) -> range:
    """Which sgd_dev dialogues the default prompts open with: ``sgd`` of them, spread over the file."""
    return range(0, dialogues, max(1, dialogues // max(sgd, 1)))[:sgd]  # none when sgd is 0


def dev_dialogues(data_dir: Path) -> list[Chat]:
    """The sgd_dev dialogues that open with the user, in the file's order (a prompt's index is its place here)."""
    error = missing_data(data_dir, [SGD_DEV])
    if error:
        raise error
    return [d for d in read_dialogues(data_dir / SGD_DEV) if d and d[0]["role"] == "user"]


def dev_chat(index: int, dialogue: Chat) -> Prompt:
    """A held-out chat prompt: the dialogue's first turns, ending with the user's (the reply is the assistant's)."""
    turns = dialogue[:SGD_CONTEXT_TURNS]
    while turns[-1]["role"] != "user":
        turns = turns[:-1]
    return Prompt(f"sgd_dev-{index}", tuple((m["role"], m["content"]) for m in turns), chat=True)


def short_chat(index: int, dialogue: Chat) -> Prompt:
    """A held-out request as a user types it into the app: the dialogue's first user turn alone. Its reply is short
    (the assistant's first answer: a question back, a few facts), so the prefill is a large part of what it costs."""
    return Prompt(f"sgd_short-{index}", ((dialogue[0]["role"], dialogue[0]["content"]),), chat=True)


def fitting_prompts(data_dir: Path, chats: int = 30, stories: int = len(FITTING_STORIES)) -> tuple[Prompt, ...]:
    """Held-out prompts to fit a drafter's settings on, apart from what the benchmark measures: sgd_dev chats that
    ``default_prompts`` does not pick (spread over the rest of the file), and story requests of their own."""
    dialogues = dev_dialogues(data_dir)
    used = set(default_chat_indices(len(dialogues)))
    free = [i for i in range(len(dialogues)) if i not in used]
    stride = max(1, len(free) // max(chats, 1))
    picked = [dev_chat(i, dialogues[i]) for i in free[stride // 2 :: stride][:chats]]
    requests = [Prompt(f"fit_story-{i}", (("user", text),), chat=True) for i, text in enumerate(FITTING_STORIES)]
    return tuple(picked) + tuple(requests[:stories])


def story_prompts(count: int = len(HELD_OUT_STORIES)) -> tuple[Prompt, ...]:
    """The first ``count`` story requests: held out too, and built in (they need no data folder)."""
    return tuple(Prompt(f"story-{i}", (("user", text),), chat=True) for i, text in enumerate(HELD_OUT_STORIES[:count]))


def prompt_class(name: str) -> str:
    """The class the benchmark reports ``auto`` per: a prompt's name without a trailing ``-N`` (``sgd_dev-12`` ->
    ``sgd_dev``, ``story-3`` -> ``story``), so that numbered prompts of one source are judged together."""
    return re.sub(r"-\d+$", "", name)


def read_prompt_file(path: Path) -> tuple[Prompt, ...]:
    """JSONL, one object a line: ``{"messages": [{"role", "content"}, ...]}`` or ``{"prompt": "raw text"}``."""
    if not path.exists():
        raise XpressError(f"prompt file {path} does not exist")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise XpressError(f"{where}: not JSON ({error.msg})") from error
        name = str(item.get("name", f"{path.stem}-{number}")) if isinstance(item, dict) else ""
        if isinstance(item, dict) and isinstance(item.get("prompt"), str):
            prompts.append(Prompt(name, item["prompt"], chat=False))
        elif (
            isinstance(item, dict)
            and isinstance(item.get("messages"), list)
            and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in item["messages"]
            )
            and item["messages"]
        ):
            prompts.append(Prompt(name, tuple((m["role"], m["content"]) for m in item["messages"]), chat=True))
        else:
            raise XpressError(
                f'{where}: expected {{"messages": [{{"role": ..., "content": ...}}]}} or {{"prompt": "..."}}'
            )
    if not prompts:
        raise XpressError(f"prompt file {path} holds no prompt")
    return tuple(prompts)


# Story requests unlike the training stories (TinyStories: a child's world, simple words): other genres, adult
# characters, other registers. Written for this project; no set tuned on them (held out whole, ``split_of``).
OFF_DOMAIN_STORIES = (
    "Write a short detective story set in a rainy harbour town in 1923.",
    "Tell me a science fiction story about a cargo pilot who finds a signal near Jupiter.",
    "Write a story about an old fisherman teaching his granddaughter to repair nets.",
    "Tell me a ghost story that takes place in an empty train station at midnight.",
    "Write a story about a chef who loses her sense of taste the night before a competition.",
    "Tell me a story about two rival architects forced to design one bridge together.",
    "Write a fable about a clever fox and a proud eagle, with a moral at the end.",
    "Tell me a story about a nurse working the night shift during a snowstorm.",
    "Write a story about a retired astronaut who opens a bakery.",
    "Tell me an adventure story about explorers crossing a desert to find a lost library.",
    "Write a courtroom drama about a young lawyer defending a lighthouse keeper.",
    "Tell me a story about a violinist who plays in a subway station every winter morning.",
    "Write a western about a stagecoach driver caught in a dust storm.",
    "Tell me a story about a translator at a peace conference who notices a mistake in a treaty.",
    "Write a mystery about a museum guard who finds one painting hung upside down.",
    "Tell me a story about a mountain rescue team searching for a missing climber at dawn.",
    "Write a comedy about a wedding planner whose every plan goes wrong on the same day.",
    "Tell me a story about a marine biologist who hears a whale song no one has recorded before.",
    "Write a story about a printer in 1850 who discovers a secret message in a manuscript.",
    "Tell me a story about a farmer who builds a windmill after a long drought.",
)
SMALL_TALK_PROMPTS = 20  # Topical-Chat conversations cut after their second user turn (``small_talk_prompts``)


def small_talk_prompts(data_dir: Path, count: int = SMALL_TALK_PROMPTS) -> tuple[Prompt, ...]:
    """Open-domain small talk between two people (Topical-Chat, its last conversations; A -> user, B -> assistant),
    each cut after its second user turn. The target's corpus holds Topical-Chat, so the text is not new to the models;
    the class is new to every constant tuned on the benchmark's sets (held out whole)."""
    error = missing_data(data_dir, [Path("topical_chat") / "topical_chat_AB.txt"])
    if error:
        raise error
    chats = [d for d in read_dialogues(data_dir / "topical_chat" / "topical_chat_AB.txt") if len(d) >= 3]
    picked = chats[-count:]
    return tuple(
        Prompt(f"small_talk-{i}", tuple((m["role"], m["content"]) for m in chat[:3]), chat=True)
        for i, chat in enumerate(picked)
    )


def new_story_prompts() -> tuple[Prompt, ...]:
    return tuple(Prompt(f"new_story-{i}", (("user", text),), chat=True) for i, text in enumerate(OFF_DOMAIN_STORIES))


# Prompt sets that no constant was tuned on at all: reported beside the held-out half of the others.
OFF_DOMAIN_SETS = ("small_talk", "new_stories")
SPLITS = ("tune", "held")
# The sets shipped in xpress_core/prompts/ (``derive_prompt_sets`` writes them), by name.
PROMPT_SETS = ("sgd_dev", "sgd_short", "stories", "quick", "small_talk", "new_stories")


def split_of(prompt: Prompt) -> str:
    """The half a prompt belongs to, fixed once for every prompt set: "tune" (constants and designs are chosen on it)
    or "held" (reported only), by the first byte of the SHA-256 of its content (its messages as JSON, or its raw
    text), so the split depends on no order and no file. The off-domain sets (``OFF_DOMAIN_SETS``) are "held"
    whole."""
    if prompt_class(prompt.name) in ("small_talk", "new_story"):
        return "held"
    content = prompt.content if isinstance(prompt.content, str) else json.dumps(prompt.content, ensure_ascii=False)
    return "tune" if hashlib.sha256(content.encode("utf-8")).digest()[0] < 128 else "held"


def derive_prompt_sets(data_dir: Path) -> dict[str, tuple[Prompt, ...]]:
    """The shipped prompt sets (``xpress_core/prompts/<name>.jsonl``) as derived from the data folder: what
    ``scripts/make_prompts.py`` writes, and what ``evaluation_prompts`` derives afresh from another folder."""
    return {
        "sgd_dev": default_prompts(data_dir, stories=0),
        "sgd_short": default_prompts(data_dir, sgd=0, stories=0, short=SHORT_CHATS),
        "stories": story_prompts(),
        "quick": default_prompts(data_dir, *QUICK_PROMPTS),
        "small_talk": small_talk_prompts(data_dir),
        "new_stories": new_story_prompts(),
    }


def evaluation_prompts(sets: Sequence[str], data_dir: Path | None = None) -> tuple[Prompt, ...]:
    """The named prompt sets, one after the other: as shipped, or derived afresh from ``data_dir``."""
    if data_dir is None:
        return tuple(p for name in sets for p in read_prompt_file(PROMPTS / f"{name}.jsonl"))
    derived = derive_prompt_sets(data_dir)
    return tuple(p for name in sets for p in derived[name])


def prompt_lines(prompts: Sequence[Prompt]) -> str:
    """JSONL as ``read_prompt_file`` reads it back: each prompt's name, and its messages or its raw text."""
    lines = []
    for p in prompts:
        if isinstance(p.content, str):
            item = {"name": p.name, "prompt": p.content}
        else:
            item = {"name": p.name, "messages": [{"role": r, "content": c} for r, c in p.content]}
        lines.append(json.dumps(item, ensure_ascii=False) + "\n")
    return "".join(lines)


def spread(prompts: Sequence[Prompt], count: int) -> tuple[Prompt, ...]:
    """``count`` prompts evenly spaced over the list (both chats and stories end up in the search subset)."""
    if count >= len(prompts):
        return tuple(prompts)
    return tuple(prompts[i * len(prompts) // count] for i in range(count))
