"""The `halfsafe` command's exit statuses: 0 all good; 1 the command ran and found a problem
(check: verdict not healthy; generate: an image still broken; explain: the image is); 2 it could
not run (missing or malformed file, refused pickle, unsupported model, bad flag)."""

EXIT_OK, EXIT_PROBLEM, EXIT_CANNOT_RUN = 0, 1, 2
