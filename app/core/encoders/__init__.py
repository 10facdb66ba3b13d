"""Text encoders and their inputs: companion encoder and VAE files, the shipped tokenizers, and prompts as AUTOMATIC1111 reads them."""
