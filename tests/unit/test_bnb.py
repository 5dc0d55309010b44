"""bitsandbytes' "pip install kernels" advice is dropped wherever the pack imports it (the
nodes in ComfyUI as much as the command line), and nothing else bitsandbytes logs is."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from comfyui_lingbot_world.wan.runtime import bnb as bnb_import

ROOT = Path(__file__).resolve().parents[2]
IMPORT_PACK = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from _standalone import import_pack; import_pack(); "


def _stderr_of(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    done = subprocess.run([sys.executable, "-c", "import logging; logging.basicConfig(level=logging.INFO); " + code],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_the_pack_imports_bitsandbytes_without_the_kernels_advice():
    if bnb_import.ADVICE not in _stderr_of("import bitsandbytes"):
        pytest.skip("bitsandbytes gives this CPU no advice to silence (it has no AVX512-BF16)")
    # The modules ComfyUI's nodes reach first: the expert loaders and the dense-weight path.
    quiet = _stderr_of(IMPORT_PACK + "import comfyui_lingbot_world.loaders.nf4, comfyui_lingbot_world.loaders.bf16, "
                       "comfyui_lingbot_world.pipeline.long_video")
    assert bnb_import.ADVICE not in quiet, quiet


def test_other_bitsandbytes_records_still_reach_the_log(caplog):
    logger = logging.getLogger(bnb_import.ADVICE_LOGGER)
    with caplog.at_level(logging.WARNING):
        logger.warning("Failed to load CPU gemm_4bit_forward ... Please make sure you already `pip install kernels`")
        logger.warning("a real problem")
        logger.error("a real error")
    assert [r.getMessage() for r in caplog.records] == ["a real problem", "a real error"]


def test_the_bitsandbytes_logger_level_is_left_alone():
    # The command line used to set "bitsandbytes" to ERROR, hiding every warning.
    assert logging.getLogger("bitsandbytes").level == logging.NOTSET
