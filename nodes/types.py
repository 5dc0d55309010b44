"""Names of the socket types the pack's nodes pass between each other."""

TEXT = "LINGBOT_TEXT"  # pipeline.text.TextEmbeddings
DIT = "LINGBOT_DIT"  # nodes.expert_patcher.DiTExperts
CAMERA = "LINGBOT_CAMERA"  # pipeline.camera.CameraCondition
I2V = "LINGBOT_I2V"  # pipeline.image.I2VCondition

CATEGORY = "LingBot-World"
