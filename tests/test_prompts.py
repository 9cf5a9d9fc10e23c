"""The evaluation prompts that ship in ``xpress_core/prompts/``: what the benchmark and the Sweep measure wherever
the project is cloned, equal to what ``scripts/make_prompts.py`` derives from the data folder."""

from __future__ import annotations

import pytest

from scripts.make_prompts import prompt_files
from tests.test_train import make_data
from xpress_core.bench.cli import FULL, QUICK
from xpress_core.data import (
    DEFAULT_DATA,
    HELD_OUT_STORIES,
    PROMPTS,
    SGD_DEV,
    evaluation_prompts,
    prompt_lines,
    read_prompt_file,
)
from xpress_core.errors import XpressError
from xpress_core.train.corpus import check_data

SETS = ("sgd_dev", "sgd_short", "stories", "quick")


def test_the_shipped_sets_are_the_prompts_the_benchmark_always_measured():
    """Known names (the sgd_dev dialogues that open with the user, 2482 of them, spread: every 49th for 50 chats,
    every 124th for 20, 0 and 1241 for 2) and the story requests' text; no data folder needed."""
    names = {name: [p.name for p in evaluation_prompts([name])] for name in SETS}
    assert names["sgd_dev"] == [f"sgd_dev-{49 * i}" for i in range(50)]
    assert names["sgd_short"] == [f"sgd_short-{124 * i}" for i in range(20)]
    assert names["stories"] == [f"story-{i}" for i in range(10)]
    assert names["quick"] == ["sgd_dev-0", "sgd_dev-1241", "sgd_short-0", "sgd_short-1241", "story-0", "story-1"]
    assert [p.content for p in evaluation_prompts(["stories"])] == [(("user", t),) for t in HELD_OUT_STORIES]
    for prompt in evaluation_prompts(["sgd_dev"]):  # cut after the second user turn: the reply is the assistant's
        assert prompt.chat and [role for role, _ in prompt.content] == ["user", "assistant", "user"]
    shorts = evaluation_prompts(["sgd_short"])
    assert all(p.chat and [role for role, _ in p.content] == ["user"] for p in shorts)  # the first user turn alone
    assert shorts[0].content == evaluation_prompts(["sgd_dev"])[0].content[:1]  # dialogue 0 opens both sets
    assert FULL.prompt_sets == ("sgd_dev", "sgd_short", "stories") and QUICK.prompt_sets == ("quick",)
    assert sum(f.stat().st_size for f in PROMPTS.glob("*.jsonl")) < 100_000


def test_a_set_written_reads_back_equal(tmp_path):
    for name in SETS:
        path = tmp_path / f"{name}.jsonl"
        path.write_text(prompt_lines(evaluation_prompts([name])), encoding="utf-8")
        assert read_prompt_file(path) == evaluation_prompts([name])


@pytest.mark.skipif(
    not (DEFAULT_DATA / SGD_DEV).exists(),
    reason=f"the data folder the sets are derived from is not here ({DEFAULT_DATA / SGD_DEV})",
)
def test_the_shipped_files_are_what_the_script_derives_from_the_data_folder():
    written = prompt_files(DEFAULT_DATA)
    assert sorted(written) == sorted(f.name for f in PROMPTS.glob("*.jsonl"))
    for name, text in written.items():
        assert (PROMPTS / name).read_text(encoding="utf-8") == text, name


def test_a_set_derived_from_another_data_folder(tmp_path):
    """``--data DIR``: the same sets, derived afresh from that folder (here 6 dialogues: every one is picked)."""
    data = make_data(tmp_path)
    assert [p.name for p in evaluation_prompts(["quick"], data)] == [
        "sgd_dev-0",
        "sgd_dev-2",
        "sgd_short-0",
        "sgd_short-2",
        "story-0",
        "story-1",
    ]


def test_training_without_its_data_says_what_to_fetch_and_where(tmp_path):
    with pytest.raises(XpressError) as missing:
        check_data(tmp_path)
    message = str(missing.value)
    for needle in (
        "lacks sgd/sgd_train.txt, sgd/sgd_dev.txt, topical_chat/topical_chat_AB.txt, tinystories/tinystories_a.txt",
        "github.com/google-research-datasets/dstc8-schema-guided-dialogue",
        "github.com/alexa/Topical-Chat",
        "roneneldan/TinyStories",
        "--data DIR",
    ):
        assert needle in message
    (make_data(tmp_path) / "topical_chat" / "topical_chat_AB.txt").unlink()
    with pytest.raises(XpressError, match=r"lacks topical_chat/topical_chat_AB\.txt:"):
        check_data(tmp_path)
    check_data(make_data(tmp_path))  # all there: no error
