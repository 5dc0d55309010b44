"""LingBot-World for ComfyUI: camera-controlled image-to-video on ordinary hardware.

Inside ComfyUI this module exposes the node classes. Imported anywhere else (tests,
command-line tools) it is a plain library: ``wan``, ``loaders`` and ``pipeline``.
"""
NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}
# The page's extensions (the Play panel): ComfyUI serves this folder under
# /extensions/<pack folder>/ and the page imports every .js file in it.
WEB_DIRECTORY = "./web"

# ComfyUI imports the pack as a package (relative imports work) after putting its own
# modules on sys.path. pytest, collecting a checkout whose folder holds this file, imports
# it as a lone module with no parent package: it must then stay a no-op, whatever the
# folder is called (the users' clones are named comfyui-lingbot-world).
if __package__:
    try:
        import folder_paths  # noqa: F401
    except ImportError:
        pass
    else:
        from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: F811

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
