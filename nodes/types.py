"""The socket types the pack's nodes pass between each other, as ComfyUI V3 io types."""
from comfy_api.latest import io

TEXT = "LINGBOT_TEXT"  # pipeline.text.TextEmbeddings
DIT = "LINGBOT_DIT"  # nodes.expert_patcher.DiTExperts
CAMERA = "LINGBOT_CAMERA"  # pipeline.camera.CameraCondition
I2V = "LINGBOT_I2V"  # pipeline.image.I2VCondition

Text = io.Custom(TEXT)
DiT = io.Custom(DIT)
Camera = io.Custom(CAMERA)
I2VCond = io.Custom(I2V)

CATEGORY = "LingBot-World"
