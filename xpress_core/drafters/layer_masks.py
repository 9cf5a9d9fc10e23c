"""Which keys each block query of a drafter layer sees, for DFlash's layer kinds (``layer_causal``, ``layer_window``
in ``XpressDrafterConfig``): a causal layer hides the later keys, a sliding-window layer the far ones. Drafting keeps
the context from position 0 on, so a key's slot is its absolute position and the keys run up to the block's last
position. Whether a layer needs a mask at all is decided on the host, from the positions' counts.
"""

from __future__ import annotations

import torch


def block_masks(causal, windows, positions: torch.Tensor, q_len: int, keys: int) -> list[torch.Tensor | None]:
    """Per layer, the block's (1, 1, Q, S) boolean attention mask, or None (everything visible: ``sees_everything``),
    for the last ``q_len`` of ``positions`` over ``keys`` keys."""
    query = positions[0, -q_len:, None]  # (Q, 1)
    key = torch.arange(keys, device=positions.device)[None]  # (1, S)
    masks = []
    for is_causal, window in zip(causal, windows):
        if sees_everything(is_causal, window, q_len, keys):
            masks.append(None)
            continue
        visible = torch.ones((q_len, keys), dtype=torch.bool, device=positions.device)
        if is_causal:
            visible &= key <= query
        if window is not None:
            visible &= query - key < window
            if not is_causal:  # a bidirectional window reaches as far ahead as back
                visible &= key - query < window
        masks.append(visible[None, None])
    return masks


def sees_everything(causal: bool, window: int | None, q_len: int, keys: int) -> bool:
    """Whether the block's queries (the last ``q_len`` of ``keys`` positions) each see every key, decided on the host
    (a device tensor's ``all()`` would make the host wait): a causal layer hides later keys from all but the last
    query; a window hides keys ``window`` or more positions behind the last query (and ahead of the first, both
    ways)."""
    if causal and q_len > 1:
        return False
    return window is None or (keys - 1 < window and (causal or q_len - 1 < window))
