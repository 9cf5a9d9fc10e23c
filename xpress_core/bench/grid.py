"""The xPress settings a benchmark runs: ``"K=1,4 T=1,2,L L=8; ..."`` parsed into ``DecodeConfig``s."""

from __future__ import annotations

from itertools import product

from ..config import DIVERSITY, REFINE_MODES, SAMPLED_DRAFTS, SCHEDULES, VERIFY_MODES, DecodeConfig
from ..errors import XpressError

# Grid keys as users write them -> DecodeConfig fields; "T=L" means as many denoise steps as block positions.
GRID_KEYS = {
    "K": "drafts",
    "T": "steps",
    "L": "block",
    "refine": "refine",
    "verify": "verify",
    "schedule": "schedule",
    "diversity": "diversity",
    "sampled": "sampled_drafts",
}


GRID_CHOICES = {
    "refine": REFINE_MODES,
    "verify": VERIFY_MODES,
    "schedule": SCHEDULES,
    "diversity": DIVERSITY,
    "sampled": SAMPLED_DRAFTS,
}


STEPS_EQUAL_BLOCK = "L"


# Draft trees (the default diversity: one row refined, so refinement modes are the same for them), and K branched rows
# refined in parallel or one by one.
FULL_GRID = (
    "K=1,2,4,8 T=1,2,L L=4,8,16 verify=tree,batch; "
    "K=1,2,4,8 T=1,2,4,L L=4,8,16 refine=parallel,serial diversity=branch-first"
)


QUICK_GRID = "K=1,4 T=1,2 L=8; K=4 T=2 L=8 refine=serial; K=4 T=2 L=8 verify=batch"


def parse_grid(spec: str) -> tuple[DecodeConfig, ...]:
    """``"K=1,4 T=1,2,L L=8 refine=parallel; K=4 ..."``: the union of the ';'-separated cartesian products.

    Keys left out take DecodeConfig's default; settings with T > L are skipped; duplicates (T=4 and T=L at L=4) are
    kept once.
    """
    configs: dict[DecodeConfig, None] = {}  # ordered set
    defaults = DecodeConfig()
    for part in filter(str.strip, spec.split(";")):
        values = _grid_values(part)
        axes = {key: values.get(key, (getattr(defaults, field),)) for key, field in GRID_KEYS.items()}
        for combo in product(*axes.values()):
            chosen = dict(zip(axes, combo))
            block = chosen["L"]
            steps = block if chosen["T"] == STEPS_EQUAL_BLOCK else chosen["T"]
            if steps > block:
                continue
            fields = {GRID_KEYS[k]: v for k, v in chosen.items()} | {"steps": steps}
            configs[DecodeConfig(**fields).validate()] = None
    if not configs:
        raise XpressError(f"the grid {spec!r} selects no setting (is every T <= L?)")
    return tuple(configs)


def _grid_values(part: str) -> dict[str, tuple]:
    values = {}
    for item in part.split():
        key, sep, raw = item.partition("=")
        if not sep or key not in GRID_KEYS or not raw:
            raise XpressError(f"grid item {item!r}: write KEY=V1,V2 with KEY one of {', '.join(GRID_KEYS)}")
        values[key] = tuple(_grid_value(key, v) for v in raw.split(","))
    return values


def _grid_value(key: str, raw: str):
    if key in GRID_CHOICES:
        if raw not in GRID_CHOICES[key]:
            raise XpressError(f"grid {key}={raw!r}: choose from {', '.join(GRID_CHOICES[key])}")
        return raw
    if key == "T" and raw == STEPS_EQUAL_BLOCK:
        return raw
    if not raw.isdigit() or int(raw) < 1:
        raise XpressError(f"grid {key}={raw!r}: expected a positive integer" + (" or L" if key == "T" else ""))
    return int(raw)
