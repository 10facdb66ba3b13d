"""LoRA files: reading, scanning and applying them, the files a browser lists, and a LoRA as a job asks for it."""
