"""Step 2 of the training pipeline: turn ``shared/data`` into chats and token files.

Mapping (also stated in the model cards):
- SGD dialogues: ``User:`` -> user, ``Assistant:`` -> assistant. ``sgd_dev.txt`` is the validation split only.
- Topical-Chat: speaker ``A`` -> user, ``B`` -> assistant (it has no assistant role of its own).
- TinyStories part a: a "tell me a story" user turn answered by the story; part b: raw text between bos and eos, so
  the target also continues plain text.

A target of another family with a chat template of its own (SmolLM2) is distilled on prompts rendered by its
template (``chat_documents``): its replies, not the corpus's, are what its drafter learns, so the corpus only supplies
the conversations that lead up to each reply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..data import SGD_DEV, Chat, missing_data, read_dialogues, read_stories
from .tokenizer import SPECIAL

STORY_REQUESTS = (
    "Tell me a story.",
    "Can you tell me a short story?",
    "Please tell me a bedtime story.",
    "I would like to hear a story for kids.",
    "Tell me a little story, please.",
)


def render_chat(chat: Chat) -> str:
    """The chat template, as text (kept equal to ``tokenizer.CHAT_TEMPLATE``; a test checks it)."""
    turns = "".join(f"<|{m['role']}|>{m['content']}{SPECIAL.end_of_turn}" for m in chat)
    return SPECIAL.bos + turns


def render_text(text: str) -> str:
    return SPECIAL.bos + text + SPECIAL.eos


SGD_TRAIN = Path("sgd") / "sgd_train.txt"


TOPICAL_CHAT = Path("topical_chat") / "topical_chat_AB.txt"


STORIES = (Path("tinystories") / "tinystories_a.txt", Path("tinystories") / "tinystories_b.txt")


def check_data(data_dir: Path) -> None:
    """Before a tokenizer or a corpus is built: every file they read is there, or the error says where to get it."""
    error = missing_data(data_dir, [SGD_TRAIN, SGD_DEV, TOPICAL_CHAT, *STORIES])
    if error:
        raise error


def training_documents(data_dir: Path) -> Iterator[str]:
    """Every training document as rendered text (never ``sgd_dev``)."""
    for chat in read_dialogues(data_dir / SGD_TRAIN):
        yield render_chat(chat)
    for chat in read_dialogues(data_dir / TOPICAL_CHAT):
        yield render_chat(chat)
    for i, story in enumerate(read_stories(data_dir / STORIES[0])):
        request = STORY_REQUESTS[i % len(STORY_REQUESTS)]
        yield render_chat([{"role": "user", "content": request}, {"role": "assistant", "content": story}])
    for story in read_stories(data_dir / STORIES[1]):
        yield render_text(story)


# Topical-Chat's last conversations, never trained on: the benchmark's small talk is the last 10.
TOPICAL_CHAT_HELD_OUT = 100


def story_opening(story: str) -> str:
    """A story's first sentence, the request's seed: the target then writes a story of its own from it."""
    first = re.split(r"(?<=[.!?])\s", story.strip(), maxsplit=1)[0]
    return first[:200]


def chat_documents(data_dir: Path, tokenizer) -> Iterator[str]:
    """Every training conversation rendered by ``tokenizer``'s own chat template (never ``sgd_dev``, nor Topical-Chat's
    last ``TOPICAL_CHAT_HELD_OUT`` conversations); stories as requests that quote a TinyStories opening."""
    topical = list(read_dialogues(data_dir / TOPICAL_CHAT))[:-TOPICAL_CHAT_HELD_OUT]
    for chat in [*read_dialogues(data_dir / SGD_TRAIN), *topical]:
        yield tokenizer.apply_chat_template(chat, tokenize=False)
    for story in read_stories(data_dir / STORIES[0]):
        request = f"Write a short story that begins: {story_opening(story)}"
        yield tokenizer.apply_chat_template([{"role": "user", "content": request}], tokenize=False)


def validation_chats(data_dir: Path) -> list[Chat]:
    return list(read_dialogues(data_dir / SGD_DEV))


def encode_documents(tokenizer, docs: list[str], batch: int = 2000) -> np.ndarray:
    """Concatenate the token ids of all documents (each already starts with bos) into one uint16 array."""
    ids: list[int] = []
    for start in range(0, len(docs), batch):
        for enc in tokenizer(docs[start : start + batch], add_special_tokens=False)["input_ids"]:
            ids.extend(enc)
    if max(ids) >= np.iinfo(np.uint16).max:
        raise ValueError("vocabulary too large for uint16 token files")
    return np.asarray(ids, dtype=np.uint16)


def own_template(tokenizer) -> bool:
    """The project's own tokenizer (its role tokens), or another family's, rendered by its own chat template."""
    return SPECIAL.assistant in tokenizer.get_vocab() or tokenizer.chat_template is None


def build_corpus(data_dir: Path, tokenizer, out_dir: Path, seed: int = 0) -> dict:
    """Write ``train.bin`` / ``val.bin`` (shuffled documents, uint16 ids) and ``stats.json``."""
    own = own_template(tokenizer)
    docs = list(training_documents(data_dir) if own else chat_documents(data_dir, tokenizer))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(docs))
    train = encode_documents(tokenizer, [docs[i] for i in order])
    render = render_chat if own else lambda chat: tokenizer.apply_chat_template(chat, tokenize=False)
    val = encode_documents(tokenizer, [render(c) for c in validation_chats(data_dir)])
    out_dir.mkdir(parents=True, exist_ok=True)
    train.tofile(out_dir / "train.bin")
    val.tofile(out_dir / "val.bin")
    stats = {"documents": len(docs), "train_tokens": int(train.size), "val_tokens": int(val.size)}
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats


def load_tokens(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype=np.uint16)
