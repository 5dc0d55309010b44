"""Host glue: what the nodes need from ComfyUI beyond the node schema.

The expert patcher under ComfyUI's memory manager (``expert_patcher``), the model and input
folders (``model_files``), the device choice and room-making before a stage (``devices``),
the host's command-line settings the loaders follow (``host_settings``), the progress bar
and latent previews (``progress``) and ``GET /lingbot/status`` (``routes``).
"""
