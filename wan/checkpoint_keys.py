"""How many numbered blocks a checkpoint's keys describe, checked before a model is built.

A loader that takes the block count from the largest index it sees (``blocks.N.…``) builds
N blocks before it compares a single key: one extra tiny tensor named ``blocks.99999.x``
made the text encoder build 100,000 blocks before it failed. ``count_blocks`` reads the
count from the keys alone and refuses it unless the indices run 0..N-1 without a gap, N is
at most a stated bound, and every block holds the tensors each block must have.
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Collection, Iterable


def _listed(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f" (and {len(names) - limit} more)" if len(names) > limit else "")


def count_blocks(keys: Iterable[str], prefix: str, max_blocks: int, required: Collection[str] = (),
                 exact: bool = False) -> int:
    """N for the keys ``<prefix><index>.<leaf>``; ValueError naming what is wrong.

    ``required``: leaves every block must hold; with ``exact`` no other leaf is allowed
    either (without it, the loader's full key check judges the others). Zero blocks is a
    valid answer here; callers decide if it is.
    """
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.(.+)$")
    most_digits = len(str(max_blocks))
    leaves: dict[int, set[str]] = defaultdict(set)
    for key in keys:
        match = pattern.match(key)
        if match is None:
            continue
        digits = match.group(1)
        if len(digits) > most_digits or int(digits) >= max_blocks:
            raise ValueError(f"tensor {key!r} is block {int(digits) if len(digits) < 20 else digits[:20] + '...'} "
                             f"but a model of this kind has at most {max_blocks} blocks ({prefix}0 to "
                             f"{prefix}{max_blocks - 1}): the file is corrupt or not this model's")
        leaves[int(digits)].add(match.group(2))
    count = len(leaves)
    if count and max(leaves) != count - 1:
        gaps = sorted(set(range(max(leaves) + 1)) - set(leaves))
        shown = ", ".join(f"{prefix}{i}" for i in gaps[:3]) + (f" (and {len(gaps) - 3} more)" if len(gaps) > 3 else "")
        raise ValueError(f"blocks {prefix}0 to {prefix}{max(leaves)} are named but {shown} hold no tensor: "
                         "the block numbering has a gap; the file is corrupt or incomplete")
    for index in range(count):
        name = f"{prefix}{index}."
        missing = sorted(name + leaf for leaf in set(required) - leaves[index])
        unexpected = sorted(name + leaf for leaf in leaves[index] - set(required)) if exact else []
        if missing or unexpected:
            parts = [f"{len(missing)} missing key(s): {_listed(missing)}"] if missing else []
            parts += [f"{len(unexpected)} unexpected key(s): {_listed(unexpected)}"] if unexpected else []
            raise ValueError(f"block {prefix}{index} does not match the model; " + "; ".join(parts))
    return count
