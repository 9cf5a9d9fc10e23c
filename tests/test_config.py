"""``DecodeConfig.from_mapping``: the one way the CLI, the app and the tests turn named settings into a config."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from xpress_core.cli import build_parser
from xpress_core.config import DecodeConfig
from xpress_core.errors import XpressError


def test_cli_arguments_give_the_config_they_name():
    args = build_parser().parse_args(
        ["generate", "--prompt", "hi", "-K", "4", "-T", "2", "-L", "6", "--temperature", "0.7", "--top-k", "5"]
        + ["--seed", "3", "--refine", "serial", "--verify", "batch", "--stop", "User:", "--stop", "\n\n"]
        + ["--sampled-drafts", "most-likely"]
    )
    assert DecodeConfig.from_mapping(vars(args)) == DecodeConfig(
        drafts=4,
        steps=2,
        block=6,
        temperature=0.7,
        top_k=5,
        seed=3,
        refine="serial",
        verify="batch",
        sampled_drafts="most-likely",
        stop=("User:", "\n\n"),
    )


def test_slider_floats_become_ints_and_other_keys_are_ignored():
    config = DecodeConfig.from_mapping({"drafts": 4.0, "block": 8.0, "temperature": 1, "race": True, "preset": "x"})
    assert config == DecodeConfig(drafts=4, block=8, temperature=1.0)
    assert type(config.drafts) is int and type(config.temperature) is float
    assert DecodeConfig.from_mapping({}) == DecodeConfig()


@pytest.mark.parametrize(
    "values,message",
    [
        ({"drafts": 2.5}, "drafts must be a whole number, got 2.5"),
        ({"drafts": True}, "drafts must be a whole number, got True"),
        ({"seed": float("nan")}, "seed must be a whole number"),
        ({"max_new_tokens": "12"}, "max_new_tokens must be a whole number"),
        ({"sampled_drafts": "random"}, "sampled drafts must be one of"),
        ({"temperature": "hot"}, "temperature must be a number, got 'hot'"),
        ({"steps": 9, "block": 8}, "denoise steps T must be in 1..L=8"),  # then validated
    ],
)
def test_bad_values_are_refused_with_the_field_named(values, message):
    with pytest.raises(XpressError, match=message):
        DecodeConfig.from_mapping(values)


def test_every_field_can_be_named():
    config = DecodeConfig(
        drafts=2,
        steps=2,
        block=4,
        top_p=0.9,
        schedule="left-to-right",
        diversity="gumbel",
        sampled_drafts="most-likely",
    )
    assert DecodeConfig.from_mapping(asdict(config)) == config
