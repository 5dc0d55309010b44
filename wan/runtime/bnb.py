"""bitsandbytes, imported for the whole pack from this one module.

On CPUs with AVX512-BF16, ``import bitsandbytes`` logs "Failed to load CPU gemm_4bit_forward
from kernels-community ... pip install kernels": an optional kernel it would fetch from the
Hugging Face Hub, which the pack never uses (its CPU path runs without it). In ComfyUI that
line appeared on every start. Only that one record is dropped, by a filter on the logger
that emits it, installed before the first import; every other bitsandbytes warning and
error still reaches the log.
"""
from __future__ import annotations

import logging

# The logger bitsandbytes' CPU backend writes the advice to, and a phrase of the advice.
ADVICE_LOGGER = "bitsandbytes.backends.cpu.ops"
ADVICE = "pip install kernels"


class _DropKernelsAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return ADVICE not in record.getMessage()


def _install_filter() -> None:
    logger = logging.getLogger(ADVICE_LOGGER)
    if not any(isinstance(f, _DropKernelsAdvice) for f in logger.filters):
        logger.addFilter(_DropKernelsAdvice())


_install_filter()

import bitsandbytes as bnb  # noqa: E402  (after the filter: the advice is logged at import)
from bitsandbytes.nn import Linear4bit, Params4bit  # noqa: E402
from bitsandbytes.utils import unpack_tensor_to_dict  # noqa: E402

__all__ = ["bnb", "Linear4bit", "Params4bit", "unpack_tensor_to_dict", "ADVICE", "ADVICE_LOGGER"]
