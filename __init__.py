"""LingBot-World for ComfyUI: camera-controlled image-to-video on ordinary hardware.

Inside ComfyUI this module exposes the node classes. Imported anywhere else (tests,
command-line tools) it is a plain library: ``wan``, ``loaders`` and ``pipeline``.
"""
try:  # ComfyUI puts its own modules on sys.path before it imports custom nodes.
    import folder_paths  # noqa: F401
except ImportError:
    NODE_CLASS_MAPPINGS: dict = {}
    NODE_DISPLAY_NAME_MAPPINGS: dict = {}
else:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
