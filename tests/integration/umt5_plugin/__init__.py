"""Test-only ComfyUI custom node package: core's Wan text encoder at a tiny geometry.

Loaded ONLY by the servers of tests/integration/test_comfy_text_encoder.py (through an
``--extra-model-paths-config`` that adds a ``custom_nodes`` folder); never shipped with the
pack, and the host's own files are not edited.

Core ComfyUI builds the Wan text encoder (CLIPLoader type ``wan``) from a fixed
``comfy/text_encoders/umt5_config_xxl.json`` (4096 wide, 24 blocks, 256384 tokens) and only
recognises umT5-XXL by block 23's shapes, so a tiny synthetic file would be taken for
another encoder. In this server process only, this plugin:

- answers ``comfy.sd.detect_te_model`` with T5_XXL for a umT5 state dict (a position table
  in every block, gated FFN, a ``spiece_model``) that core did not recognise;
- lets ``comfy.sd.t5xxl_detect`` read the dtype and fp8 scaling of such a file (core only
  looks at files with a block 23);
- hands ``comfy.sd1_clip.SDClipModel`` the config JSON named by ``$LINGBOT_TINY_UMT5_CONFIG``
  instead of ``umt5_config_xxl.json``.

Everything else (tokenizer from the file's ``spiece_model``, T5 forward, masks, fp8 ops,
CLIPTextEncode) is the host's own code. It also adds ``LingBotTestSaveTensors``, an output
node that writes a CONDITIONING or a LingBot TEXT value to output/<name>.safetensors so a
test can compare embeddings.
"""
from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

import torch

log = logging.getLogger("lingbot_tiny_umt5_plugin")
CONFIG_ENV = "LINGBOT_TINY_UMT5_CONFIG"
HOST_CONFIG_NAME = "umt5_config_xxl.json"


def _is_small_umt5(sd) -> bool:
    return ("spiece_model" in sd and "encoder.block.0.layer.1.DenseReluDense.wi_1.weight" in sd
            and "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" in sd)


def install() -> None:
    import comfy.sd
    import comfy.sd1_clip
    import comfy.text_encoders.sd3_clip

    config_path = os.environ.get(CONFIG_ENV)
    if not config_path:
        raise RuntimeError(f"lingbot tiny umT5 plugin: set {CONFIG_ENV} to the tiny config JSON")
    config = json.loads(Path(config_path).read_text())

    real_detect = comfy.sd.detect_te_model

    @functools.wraps(real_detect)
    def detect_te_model(sd):
        found = real_detect(sd)
        if found != comfy.sd.TEModel.T5_XXL and _is_small_umt5(sd):
            return comfy.sd.TEModel.T5_XXL
        return found

    real_t5xxl_detect = comfy.sd.t5xxl_detect

    @functools.wraps(real_t5xxl_detect)
    def t5xxl_detect(clip_data):
        found = real_t5xxl_detect(clip_data)
        if not found:
            for sd in clip_data:
                if _is_small_umt5(sd):
                    return comfy.text_encoders.sd3_clip.t5_xxl_detect(sd)
        return found

    real_init = comfy.sd1_clip.SDClipModel.__init__

    @functools.wraps(real_init)
    def init(self, *args, **kwargs):
        chosen = kwargs.get("textmodel_json_config")
        if isinstance(chosen, str) and os.path.basename(chosen) == HOST_CONFIG_NAME:
            kwargs["textmodel_json_config"] = dict(config)
        real_init(self, *args, **kwargs)

    comfy.sd.detect_te_model = detect_te_model
    comfy.sd.t5xxl_detect = t5xxl_detect
    comfy.sd1_clip.SDClipModel.__init__ = init
    log.info("lingbot tiny umT5 plugin: Wan text encoder built from %s", config_path)


class LingBotTestSaveTensors:
    """Output node for tests: CONDITIONING (first entry), LingBot TEXT or an IMAGE batch ->
    safetensors file in the output folder."""

    CATEGORY = "testing"
    RETURN_TYPES = ()
    FUNCTION = "save"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("*", {}), "name": ("STRING", {"default": "tensors"})}}

    @classmethod
    def VALIDATE_INPUTS(cls, input_types=None, **_):
        return True  # accepts any socket type

    def save(self, value, name):
        import folder_paths
        from safetensors.torch import save_file

        if isinstance(value, list):  # CONDITIONING: [[cond [B, L, dim], {extras}], ...]
            tensors = {"cond": value[0][0]}
            mask = value[0][1].get("attention_mask")
            if mask is not None:
                tensors["attention_mask"] = mask
        elif isinstance(value, torch.Tensor):  # IMAGE [frames, H, W, 3] (before hasattr: tensors have .positive())
            tensors = {"image": value}
        elif hasattr(value, "positive"):  # the pack's TextEmbeddings
            tensors = {"positive": value.positive, "negative": value.negative}
        else:
            raise TypeError(f"LingBotTestSaveTensors: cannot save a {type(value).__name__}")
        filename = f"{name}.safetensors"
        out = Path(folder_paths.get_output_directory()) / filename
        save_file({k: v.detach().to("cpu", torch.float32).contiguous() for k, v in tensors.items()}, str(out))
        return {"ui": {"files": [{"filename": filename, "subfolder": "", "type": "output"}]}}


install()

NODE_CLASS_MAPPINGS = {"LingBotTestSaveTensors": LingBotTestSaveTensors}
NODE_DISPLAY_NAME_MAPPINGS = {"LingBotTestSaveTensors": "LingBot Save Tensors (tests)"}
