"""Check Triton kernels on a machine without a GPU: a snippet run under Triton's CPU
interpreter, in a fresh process (TRITON_INTERPRET is read when triton is imported). The
snippet imports the pack and asserts; the test fails with its output when it raises."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_interpreted(snippet: str) -> None:
    """Run ``snippet`` with the checkout importable as ``comfyui_lingbot_world`` and Triton
    interpreting its kernels on the CPU; skip where Triton is not installed."""
    pytest.importorskip("triton")
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from _standalone import import_pack; import_pack()\n"
    done = subprocess.run([sys.executable, "-c", code + snippet], env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
