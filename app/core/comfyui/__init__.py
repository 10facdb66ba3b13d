"""The desktop side of HalfSafe's ComfyUI nodes: a ComfyUI graph with HalfSafe Fix placed
between its model loader and the loader's consumers (`workflow`), and the node package copied
into a ComfyUI's custom_nodes folder (`install`). Plain files and JSON; no torch."""
