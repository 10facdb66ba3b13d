"""One generation job: its stages (`stages`), beside them the probes of a failing part
(`probes`) and the repairs built on those (`repair`), and the pipeline's safety checker run
over the finished images."""

from __future__ import annotations

import weakref
from typing import Any

from app.core.generation.probes import Probes
from app.core.generation.repair import Repairs
from app.core.generation.stages import JobStages
from app.core.images.finished import image_array
from app.core.run.stage_run import computing


class Job(JobStages):
    """One request on one PlacedPipeline, run on the calling thread: encode, denoise and decode
    (`run`); its repairer (`repairs`: repair an image, tell whether a failure recurs, suggest a
    fix) over its probes (`probes`); and the safety check."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.probes = Probes(self)
        self.repairs = Repairs(self, self.probes)

    def safety_check(self, images: list[Any]) -> tuple[list[bool], list[Any]]:
        """Run the pipeline's safety checker, if it has one: (flagged, images as it left them)."""
        import numpy as np
        import torch
        from PIL import Image

        pipeline = self.model.pipeline
        checker = getattr(pipeline, "safety_checker", None)
        extractor = getattr(pipeline, "feature_extractor", None)
        if checker is None or extractor is None or not images:
            return [False] * len(images), images
        module = _placed_checker(checker, self.device)
        params = list(module.parameters())
        dtype = params[0].dtype if params else torch.float32
        clip_input = extractor(images, return_tensors="pt").pixel_values.to(self.device, dtype)
        arrays = np.stack([image_array(image) for image in images])
        with computing(self.plan):  # on its own copy: no component of the plan is placed
            checked, flagged = module(images=arrays, clip_input=clip_input)
        flagged = [bool(f) for f in flagged]
        out = []
        for image, array, hit in zip(images, checked, flagged, strict=True):
            if hit:
                unit = np.clip(np.asarray(array, dtype=np.float32), 0.0, 1.0)
                image = Image.fromarray((unit * 255).round().astype(np.uint8), "RGB")
            out.append(image)
        return flagged, out


# The safety checker's copy on the job's device, per loaded checker; dropped with the model.
_CHECKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _placed_checker(checker, device):
    """The safety checker on the job's device (the loaded pipeline stays on the CPU)."""
    import copy

    first = next(checker.parameters(), None)
    if first is None or first.device == device:
        return checker
    cached = _CHECKERS.get(checker)
    if cached is not None and cached[0] == str(device):
        return cached[1]
    _CHECKERS.pop(checker, None)  # free the copy on another device first
    placed = copy.deepcopy(checker).to(device)
    _CHECKERS[checker] = (str(device), placed)
    return placed
