"""What the tests and benchmarks build in code: tiny models, model files, the hostile-file corpus,
images with generation records, and job kinds that exercise the engine. Never shipped: nothing
under app/ imports it."""
