"""What a job is asked to do (one record per kind of job), running a request on a loaded model, and checking many models in one run."""
