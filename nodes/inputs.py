"""The socket types the pack's nodes pass between each other, as ComfyUI V3 io types."""
from comfy_api.latest import io

TEXT = "LINGBOT_TEXT"  # pipeline.text.TextEmbeddings
DIT = "LINGBOT_DIT"  # nodes.host.expert_patcher.DiTExperts
CAMERA = "LINGBOT_CAMERA"  # pipeline.camera.CameraCondition
I2V = "LINGBOT_I2V"  # pipeline.image.I2VCondition
CAMERA_PATH = "LINGBOT_CAMERA_PATH"  # pipeline.camera.CameraPath

Text = io.Custom(TEXT)
DiT = io.Custom(DIT)
Camera = io.Custom(CAMERA)
I2VCond = io.Custom(I2V)
CameraPathType = io.Custom(CAMERA_PATH)

CATEGORY = "LingBot-World"


def offered(node: type[io.ComfyNode], **values) -> bool | str:
    """True when every given combo value is one the node offers now, else what is wrong.

    For the nodes' ``validate_inputs`` of the file and folder combos: the 0.3.x hosts do not
    check V3 combo values at all, and a host skips its own check of an input that
    ``validate_inputs`` takes, so the pack checks them the same way on every host.
    """
    # define_schema, not GET_SCHEMA: during validation the class is a locked clone that
    # cannot cache a schema.
    options = {i.id: i.options for i in node.define_schema().inputs if isinstance(i, io.Combo.Input)}
    wrong = [
        f"{name}: {value!r} is not offered; the list has {len(options[name])} entries (refresh, or check the "
        "model folders)"
        for name, value in values.items()
        if isinstance(value, str) and value not in options.get(name, [value])
    ]
    return "; ".join(wrong) or True
