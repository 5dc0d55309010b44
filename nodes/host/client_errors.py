"""Errors a node raises reach the ComfyUI client with file names as the node lists show them.

The loaders name files by absolute path (right for the command line, where the user typed
them). A ComfyUI user picked ``lingbot/pkg/high_noise_model_bnb_nf4`` from a list and should
read that back, not the server's folder layout: before an error leaves a node, every
absolute path inside one of ComfyUI's folders is rewritten relative to it, as
``<model kind>/...`` (the combos' own naming), ``input/...``, ``output/...``, ``temp/...``,
``user/...``, or ``ComfyUI/...`` for anything else under ComfyUI's base folder. The
exception object itself (type, traceback, cause) is kept.
"""
from __future__ import annotations

import functools
import os
import re
from typing import Callable

import folder_paths

from ...loaders.errors import CheckpointError

# Model kinds the pack's lists use, preferred when a folder belongs to several kinds
# (ComfyUI maps models/text_encoders to both "text_encoders" and "clip").
_PREFERRED_KINDS = ("lingbot", "text_encoders", "vae", "diffusion_models", "loras")


def _named_folders() -> list[tuple[str, str]]:
    """(absolute folder, its name for the client), longest folder first; each folder also
    under its resolved path (symlinked model drives)."""
    named: dict[str, str] = {}

    def add(folder: str | None, name: str) -> None:
        if not folder:
            return
        for form in (os.path.abspath(folder), os.path.realpath(folder)):
            named.setdefault(form.rstrip(os.sep), name)

    kinds = folder_paths.folder_names_and_paths
    for kind in [k for k in _PREFERRED_KINDS if k in kinds] + sorted(set(kinds) - set(_PREFERRED_KINDS)):
        for folder in kinds[kind][0]:
            add(folder, kind)
    for name, folder in (("input", getattr(folder_paths, "get_input_directory", lambda: None)()),
                         ("output", getattr(folder_paths, "get_output_directory", lambda: None)()),
                         ("temp", getattr(folder_paths, "get_temp_directory", lambda: None)()),
                         ("user", getattr(folder_paths, "get_user_directory", lambda: None)()),
                         ("models", getattr(folder_paths, "models_dir", None)),
                         ("ComfyUI", getattr(folder_paths, "base_path", None))):
        add(folder, name)
    return sorted(named.items(), key=lambda item: len(item[0]), reverse=True)


def relative_names(text: str) -> str:
    """``text`` with every absolute path inside a ComfyUI folder written relative to it."""
    for folder, name in _named_folders():
        if folder and folder in text:
            # the folder itself, or a path inside it; not a longer name that starts the same
            text = re.sub(re.escape(folder) + r"(?:" + re.escape(os.sep) + r"|(?![\w.-]))",
                          lambda m: name + ("/" if m.group(0).endswith(os.sep) else ""), text)
    return text


def _rename(exc: BaseException) -> None:
    exc.args = tuple(relative_names(arg) if isinstance(arg, str) else arg for arg in exc.args)
    if isinstance(exc, CheckpointError):
        exc.path, exc.problem = relative_names(exc.path), relative_names(exc.problem)
    if isinstance(exc, OSError):
        if isinstance(exc.strerror, str):  # str(OSError(errno, text)) reads strerror, not args
            exc.strerror = relative_names(exc.strerror)
        for attr in ("filename", "filename2"):
            value = getattr(exc, attr, None)
            if isinstance(value, (str, os.PathLike)):
                setattr(exc, attr, relative_names(os.fspath(value)))


def name_files_relatively(node: type) -> type:
    """Wrap ``node.execute`` so that the errors it raises name files relative to ComfyUI's
    folders (ComfyUI's own interrupt, a BaseException on newer hosts, passes untouched)."""
    execute: Callable = node.__dict__["execute"].__func__

    @functools.wraps(execute)
    def wrapped(cls, *args, **kwargs):
        try:
            return execute(cls, *args, **kwargs)
        except Exception as exc:
            _rename(exc)
            raise

    node.execute = classmethod(wrapped)
    return node
