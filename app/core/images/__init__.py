"""Pictures in and out: the pictures a job starts from, inpainting's canvas, and finished images with their pixel diagnosis."""
