"""Step 1 of the training pipeline: a byte-level BPE tokenizer with chat special tokens.

The tokenizer is saved in Hugging Face format (``tokenizer.json`` + config with a chat template) so that any tool
loading the embedded target with ``AutoTokenizer`` gets the same ids and ``apply_chat_template`` works.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers


@dataclass(frozen=True)
class SpecialTokens:
    bos: str = "<|bos|>"
    eos: str = "<|eos|>"
    pad: str = "<|pad|>"
    mask: str = "<|mask|>"
    system: str = "<|system|>"
    user: str = "<|user|>"
    assistant: str = "<|assistant|>"
    end_of_turn: str = "<|end|>"

    def all(self) -> list[str]:
        return [self.bos, self.eos, self.pad, self.mask, self.system, self.user, self.assistant, self.end_of_turn]


SPECIAL = SpecialTokens()

# Roles map onto their special tokens; every turn closes with end-of-turn so generation can stop on it.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path) -> PreTrainedTokenizerFast:  # noqa: F821
    """Train byte-level BPE on ``texts`` and save it, HF-compatible, into ``out_dir``."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL.all(),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL.bos,
        eos_token=SPECIAL.end_of_turn,  # generation stops at the end of the assistant's turn
        pad_token=SPECIAL.pad,
        mask_token=SPECIAL.mask,
        additional_special_tokens=[SPECIAL.eos, SPECIAL.system, SPECIAL.user, SPECIAL.assistant],
    )
    hf.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out_dir)
    return hf
