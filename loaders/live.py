"""Weak references to every model the loaders build, so "what is still alive?" is answered
from a handful of entries instead of a scan of every Python object (GET /lingbot/status).

A weak reference keeps nothing alive: a model the pack freed drops out by itself.
"""
from __future__ import annotations

import weakref
from typing import TypeVar

from torch import nn

M = TypeVar("M", bound=nn.Module)

_LIVE: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


def track(module: M) -> M:
    """Remember ``module`` (weakly) and return it."""
    _LIVE.add(module)
    return module


def live_modules() -> list[nn.Module]:
    """The tracked models that still exist (a copy: safe to read from another thread)."""
    return list(_LIVE)
