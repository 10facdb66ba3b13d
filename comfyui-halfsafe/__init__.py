"""HalfSafe's ComfyUI nodes: Check, Fix and NaN Watch (see README.md)."""

from .core_import import join

join()  # before the nodes import HalfSafe's core: ComfyUI has an `app` package too

from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: E402

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
