"""Quantized and foreign file formats: fp8, int8, NVFP4 and GGUF weights kept as stored, what scanning them found, and other projects' key layouts."""
