"""The sentences of the findings only explain makes (`FINDING_WORDS`: the one table of them;
the short names of the statuses are `explanation.STATUS_WORDS`), and the words of what an
image's pixels are beyond NaN-black: one flat colour, saturated, coloured noise, and noise in
one box (`signatures`, `regions`). {placeholders} are filled in here. Plain words; no torch."""

from __future__ import annotations

from typing import Any

from app.core.explain.designs import NORMAL_MAP
from app.core.explain.pixels import zeroed_stage
from app.core.words.tools import TOOLS, in_tool_terms

# {placeholders} are filled in by the functions below and by `explanation`.
FINDING_WORDS = {
    "flat_whole": "This image ({by}) is one exact colour, RGB {colour}, in every pixel.",
    "flat_region": (
        "This image ({by}) is one exact colour, RGB {colour}, over {share} of its pixels "
        "(x {x0}-{x1}, y {y0}-{y1})."
    ),
    "nan_zeroed_pixels": (
        "That is most likely NaN values replaced by zeros: the picture came out flat grey "
        "instead of black (0 becomes exact mid-grey once the decoded image is saved), so a "
        "value overflowed somewhere in the model."
    ),
    "nan_zeroed_latent": (
        "That is most likely NaN values replaced by zeros before decoding: the picture came "
        "out one flat colour instead of black (all-zero latents decode to one colour, with a "
        "band of detail along the edges), so a value overflowed somewhere in the model."
    ),
    "hidden_by_compile": (
        "The image's workflow compiles the model ({compiled}), and compiled code can turn a "
        "NaN into 0 (see the note)."
    ),
    "hidden_by_tool": (
        "The image does not say what replaced the NaN: some versions of {tool}, and some "
        "extensions and nodes, replace NaN silently instead of reporting it."
    ),
    "flat_unknown": (
        "That looks like what a tool writes when it replaces NaN values with zeros instead "
        "of writing a black image, but a picture made flat on purpose looks the same; this "
        "image carries no generation record, so HalfSafe does not say which."
    ),
    "saturated_white": (
        "This image ({by}) is white: {share} of its pixels are 255 in every channel. A value "
        "that overflowed to infinity becomes the brightest value when the picture is clipped "
        "and saved, so a value overflowed somewhere in the model, as it does for a black image."
    ),
    "saturated_colour": (
        "This image ({by}) is saturated: {share} of its pixels have every channel at 0 or 255 "
        "(most of them RGB {colour}), which is what values that overflowed to plus or minus "
        "infinity become when the picture is clipped and saved, so a value overflowed "
        "somewhere in the model."
    ),
    "noise": (
        "This image ({by}) is coloured noise, not a picture: pixels 16 px apart are no more "
        "alike than any two (correlation {correlation:.2f}; a picture's shapes keep them "
        "alike, from 0.09 in a small photograph to 0.5 and more in a drawing) and neighbouring "
        "pixels differ more in colour than in brightness ({colour:.1f} times; in photographs "
        "at most 0.3). Nothing overflowed to make it: such images come from "
        "latents that were never denoised (too few steps, or a sampler or schedule the model "
        "was not made for), from latents decoded by the VAE of another model family, or "
        "from a quantised file (GGUF, fp8, NVFP4) its loader read wrongly."
    ),
    "noise_healthy": (
        "The health check at the image's settings ran finite and agreed with fp32 here, so "
        "the noise is not a precision fault. Check that {vae} belongs to the model, that the "
        "steps and sampler are what the model needs (a distilled model drawn with another "
        "sampler or too few steps stays noise), and, for a quantised file, that another "
        "format of the same model draws a picture."
    ),
    "unclaimed_saturated": (
        "This image ({by}) is {look}: {share} of its pixels have every channel at 0 or 255. "
        "That is what an overflow to infinity looks like once saved, but a picture made "
        "{look} on purpose looks the same; this image carries no generation record, so "
        "HalfSafe does not say which."
    ),
    "unclaimed_noise": (
        "This image ({by}) looks like coloured noise, not a picture (what a never-denoised or "
        "wrongly decoded image looks like), but noise made on purpose looks the same; this "
        "image carries no generation record, so HalfSafe does not say which."
    ),
    "noise_region": (
        "This image ({by}) is a picture with a box of coloured noise at x {x0}-{x1}, "
        "y {y0}-{y1} ({share} of it): inside the box almost none of the variance survives "
        "averaging over 64 px blocks ({structure:.2f}) and neighbouring pixels differ more in "
        "colour than in brightness ({colour:.1f} times), while the rest is a picture."
    ),
    "noise_region_pass": (
        "The image's record shows a pass over one region after the picture was made: "
        "{passes}. That pass drew the box, and it went wrong there, not the model's first "
        "pass (which drew the rest), so no precision change of the first pass is claimed. "
        "Next, in {tool}: make the image again with that pass's own settings checked: its "
        "checkpoint and VAE (a VAE of another model family decodes noise), its denoise "
        "({denoise}; noise at 1.0 means nothing of the picture was kept), and its precision "
        "({vae_switch} runs its VAE decode wider than fp16)."
    ),
    "noise_region_unnamed": (
        "The record names no second pass, but a box of noise in a finished picture is what a "
        "pass over one region (a face fix such as ADetailer or FaceDetailer, or an inpaint) "
        "leaves when it goes wrong: check that pass's checkpoint, VAE and denoise."
    ),
    "unclaimed_noise_region": (
        "This image ({by}) has a box of what looks like coloured noise at x {x0}-{x1}, "
        "y {y0}-{y1} (what a second pass that went wrong leaves), but noise put there on "
        "purpose looks the same; this image carries no generation record, so HalfSafe does "
        "not say which."
    ),
    "checker_recorded": (
        "The image's workflow runs a safety checker ({checker}), which writes exactly these "
        "pixels when it blanks an image it flags; the record does not say whether it did, so "
        "the health check decides."
    ),
    "checker_by_elimination": (
        "This image ({by}) is NaN-black, and its workflow runs a safety checker ({checker}), "
        "which writes exactly these pixels when it blanks an image it flags; the record does "
        "not say whether it did."
    ),
    "checker_healthy": (
        "The health check at the image's settings ran clean on this device ({device}): "
        "nothing overflowed, so the black is the safety checker's, not precision, and no "
        "precision setting changes it. To keep such an image, {switch}."
    ),
    "tiled_noise": (
        "This image ({by}) is tiled noise, not a picture: it {how}, a kernel's tile size, "
        "which neither a picture nor a latent's noise does. Nothing overflowed to make it: "
        "such pictures come from a fast kernel that computes wrong per tile (a low-bit matrix "
        "product on a card it does not support) or from a file its loader read as another "
        "model."
    ),
    "tiled_repeat": "repeats itself every {period} px (correlation {strength:.2f} at that distance)",
    "tiled_blocks": (
        "breaks into blocks unlike their neighbours on a {period} px grid ({strength:.0%} of "
        "the steps between neighbouring pixels lie on its lines)"
    ),
    "rgb_static": (
        "This image ({by}) is RGB static, not a picture: {extreme:.0%} of its channel values "
        "are near 0 or 255, neighbouring pixels are no more alike than any two (correlation "
        "{neighbours:.2f}), and {coloured:.0%} of its pixels are strong colours. Nothing "
        "overflowed to make it (an overflow keeps the shapes of what overflowed): such "
        "pictures come from weights read back wrong from memory (paged weights) or a kernel "
        "that wrote garbage."
    ),
    "false_colour": (
        "This image ({by}) is in false colour: a smooth picture whose colours sit around RGB "
        "{mean} and whose shapes are drawn in hue, not brightness ({hue:.1f} times as much "
        "colour as brightness in its variation), as a normal map is and a photograph or a "
        "drawing's flat colours are not. Nothing overflowed to make it: such pictures come "
        "from weights or values read back in the wrong place (paged weights) or channels "
        "decoded out of order."
    ),
    "unclaimed_look": (
        "This image ({by}) looks like {look} (what a tool's failing fast path draws), but a "
        "picture made so on purpose looks the same; this image carries no generation record, "
        "so HalfSafe does not say which."
    ),
    "made_so": (
        "This image ({by}) looks like {look}, but a picture made so on purpose looks the "
        "same: {shows}. Its record says a tool made it, not that the tool failed, so nothing "
        "is claimed and no fix is offered."
    ),
    "variant_config": (
        "Its model at {path} is another variant than the config it is built with: "
        "{counts}. A model built from that config drops or invents weights and draws noise, "
        "which is no numeric failure and no precision setting changes: use the config that "
        "came with these weights (or the weights of the config's variant)."
    ),
    "variant_tool": (
        "Its model is {mine} ({in_file} {unit}s in the file), and a loader that knows only "
        "{first} builds {in_config} ({in_file} {unit}s in the file, {in_config} in the "
        "config), leaves the rest out and draws noise, which is no numeric failure: if "
        "{tool}'s log warned of unexpected keys ({where}.{in_config} and on) when it loaded "
        "the model, update {tool} or the node that loads the model to a version that knows "
        "{mine}."
    ),
    "compiled": (
        "The image's workflow runs the model through torch.compile ({compiled}). Compiled "
        "code can return 0 where eager PyTorch returns NaN (PyTorch issue 183605: Inductor "
        "gave zeros where eager gave NaN), so a flat, grey or wrong image may hide a NaN; "
        "HalfSafe's check runs the model eagerly, uncompiled."
    ),
    "prompt_upsampler": (
        "The image's workflow has an LLM write its prompt out before it is encoded "
        "({upsampler}): in fp16 that model can overflow like any other part, and its caption, "
        "not the prompt typed, is what the text encoder read. HalfSafe checks it as the "
        "prompt upsampler where the model's folder holds it (prompt_upsampler/)."
    ),
}


# The looks (`looks`) by name, completing "looks like ..." and "is ... too".
LOOK_NAMES = {
    "tiled_noise": "tiled or blocky noise",
    "rgb_static": "RGB static",
    "false_colour": "false colour",
}
# What a fault looks like, completing "looks like ...", for a picture with a record whose pixels
# hold no evidence a design cannot show (`designs`).
MADE_SO_LOOKS = {
    "flat": (
        "NaN values replaced by zeros (one exact colour, RGB {colour}, over {share} of it, "
        "where a tool wrote zeros for NaN)"
    ),
    "saturated": ("an overflow to infinity ({share} of its pixels have every channel at 0 or 255)"),
    "noise": "coloured noise (what a never-denoised or wrongly decoded image looks like)",
    "noise_region": (
        "a box of coloured noise at x {x0}-{x1}, y {y0}-{y1} (what a second pass that went "
        "wrong leaves)"
    ),
    **{
        look: f"{name} (what a tool's failing fast path draws)" for look, name in LOOK_NAMES.items()
    },
}
# What its pixels show that a design shows too, by what was measured.
MADE_SO_SHOWS = {
    "normal_map": (
        "{normal_map:.0%} of its pixels are unit vectors with blue up, as every pixel of a "
        "normal map is"
    ),
    "drawn": (
        "{equal:.0%} of its neighbouring pixels are exactly alike, as drawn flat colours are "
        "and a decoded picture's are not"
    ),
    "flat": (
        "the colour is neither mid-grey over the whole picture (NaN zeroed after decoding) "
        "nor one colour inset from every edge among varied pixels (zeroed latents, decoded)"
    ),
    "saturated": (
        "its clipped colours are shapes or dots, as a few-colour design's or dithered art's "
        "are, not one colour over the whole picture"
    ),
    "rgb_static": (
        "its pixels go together within 4 px (correlation {independent:.2f}), as dithering's "
        "do, where static's are each their own"
    ),
    "tiled_noise": (
        "the steps inside its tiles carry no colour noise (colour {colour:.1f} times "
        "brightness, rms {step:.3f}), as a texture's or a mosaic's do, and the record names "
        "no low-bit file, cache or loader that draws tiles"
    ),
}
# One line each for the terminal's pixel figures.
PIXEL_LINES = {
    "tiled_noise": "{kind} at {period} px (strength {strength:.2f}): tiled noise",
    "rgb_static": (
        "{extreme:.0%} of channel values near 0 or 255, neighbours correlated {neighbours:.2f}: "
        "RGB static"
    ),
    "false_colour": "colours around RGB {mean}, {hue:.1f} times colour to brightness: false colour",
}


def look_figures(pixels: Any) -> tuple[str, dict[str, Any]] | None:
    """The look the pixels show (a LOOK_NAMES key) and its figures, or None."""
    if pixels.static is not None:
        return "rgb_static", pixels.static.to_json()
    if pixels.tiled is not None:
        return "tiled_noise", pixels.tiled.to_json()
    if pixels.false_colour is not None:
        figures = pixels.false_colour.to_json()
        figures["mean"] = ", ".join(str(c) for c in figures["mean"])
        return "false_colour", figures
    return None


def pixel_line(pixels: Any) -> str | None:
    """The terminal's line for the look the pixels show, or None."""
    found = look_figures(pixels)
    if found is None:
        return None
    look, figures = found
    return PIXEL_LINES[look].format(**figures)


def look_words(explanation: Any, by: str) -> str:
    """Tiled noise, RGB static or false colour in words (`looks`), claimed only with a
    record."""
    found = look_figures(explanation.pixels)
    assert found is not None  # said only of an image whose pixels show a look
    look, figures = found
    if explanation.status == "unclaimed":
        return FINDING_WORDS["unclaimed_look"].format(by=by, look=LOOK_NAMES[look])
    if look == "tiled_noise":
        how = FINDING_WORDS[f"tiled_{figures['kind']}"].format(**figures)
        return FINDING_WORDS["tiled_noise"].format(by=by, how=how)
    return FINDING_WORDS[look].format(by=by, **figures)


def flat_words(explanation: Any, by: str, tool: str) -> str:
    flat = explanation.pixels.flat
    x0, y0, x1, y1 = flat.box
    values = {
        "by": by,
        "colour": ", ".join(str(c) for c in flat.colour),
        "share": f"{flat.share:.0%}",
        "x0": x0,
        "y0": y0,
        "x1": x1 - 1,
        "y1": y1 - 1,
    }
    words = [FINDING_WORDS["flat_whole" if flat.share >= 1 else "flat_region"].format(**values)]
    if explanation.status == "flat":
        words.append(FINDING_WORDS["flat_unknown"])
        return " ".join(words)
    words.append(FINDING_WORDS[f"nan_zeroed_{zeroed_stage(flat)}"])
    compiled = explanation.record.compiled
    if compiled:
        words.append(FINDING_WORDS["hidden_by_compile"].format(compiled=compiled))
    else:
        words.append(FINDING_WORDS["hidden_by_tool"].format(tool=tool))
    return " ".join(words)


def region_words(explanation: Any, by: str) -> str:
    """A box of coloured noise in a picture (`regions`), named as the second pass the record
    shows, claimed only with a record."""
    region = explanation.pixels.noise_region
    x0, y0, x1, y1 = region.box
    values = {"by": by, "x0": x0, "y0": y0, "x1": x1 - 1, "y1": y1 - 1}
    if explanation.status == "unclaimed":
        return FINDING_WORDS["unclaimed_noise_region"].format(**values)
    words = [
        FINDING_WORDS["noise_region"].format(
            share=f"{region.share:.0%}",
            structure=region.structure,
            colour=region.colour,
            **values,
        )
    ]
    words.append(pass_words(explanation))
    return " ".join(words)


def pass_words(explanation: Any) -> str:
    """The second passes the record shows, named as what drew a box of noise, with the next
    step in the tool; or that no record names one."""
    passes = explanation.record.second_passes
    if not passes:
        return FINDING_WORDS["noise_region_unnamed"]
    tool = TOOLS.get(explanation.made_by)
    fp32_vae = in_tool_terms(explanation.made_by, {"no_half_vae": True}, ["--no-half-vae"])
    denoise = [p.denoise for p in passes if p.denoise is not None]
    return FINDING_WORDS["noise_region_pass"].format(
        passes="; ".join(p.words() for p in passes),
        tool=tool.name if tool else "the tool that made it",
        denoise=", ".join(f"{d:g}" for d in denoise) or "not recorded",
        vae_switch=" ".join(fp32_vae.flags) or "its VAE precision setting",
    )


def signature_words(explanation: Any, by: str) -> str:
    """A saturated or noisy image in words (`signatures`), claimed only with a record; an
    image with no record that shows a look (`looks`) in its words."""
    if explanation.status == "unclaimed" and look_figures(explanation.pixels) is not None:
        return look_words(explanation, by)
    saturated = explanation.pixels.saturated
    if saturated is not None:
        values = {
            "by": by,
            "share": f"{saturated.share:.1%}",
            "colour": ", ".join(str(c) for c in saturated.colour),
            "look": "white" if saturated.white else "saturated",
        }
        if explanation.status == "unclaimed":
            return FINDING_WORDS["unclaimed_saturated"].format(**values)
        key = "saturated_white" if saturated.white else "saturated_colour"
        return FINDING_WORDS[key].format(**values)
    noise = explanation.pixels.noise
    if explanation.status == "unclaimed":
        return FINDING_WORDS["unclaimed_noise"].format(by=by)
    return FINDING_WORDS["noise"].format(by=by, **noise.to_json())


def _shows(status: str, design: Any) -> str:
    """What the pixels of a picture that looks like `status` show that a design shows too."""
    figures = design.to_json()
    if design.normal_map >= NORMAL_MAP:
        return MADE_SO_SHOWS["normal_map"].format(**figures)
    if status == "tiled_noise" and design.within is not None:
        colour, step = design.within
        return MADE_SO_SHOWS["tiled_noise"].format(colour=colour, step=step)
    if status in ("flat", "saturated"):
        return MADE_SO_SHOWS[status]
    if status == "rgb_static" and design.independent is not None:
        return MADE_SO_SHOWS["rgb_static"].format(independent=design.independent)
    return MADE_SO_SHOWS["drawn"].format(**figures)


def made_so_words(explanation: Any, by: str) -> str:
    """A picture with a record that looks like a fault without evidence a picture made so on
    purpose cannot show (`designs`), in words: nothing claimed."""
    pixels = explanation.pixels
    found = look_figures(pixels)
    values: dict[str, Any] = {}
    if pixels.flat is not None:
        status = "flat"
        values = {
            "colour": ", ".join(str(c) for c in pixels.flat.colour),
            "share": f"{pixels.flat.share:.0%}",
        }
    elif pixels.saturated is not None:
        status, values = "saturated", {"share": f"{pixels.saturated.share:.1%}"}
    elif found is not None:
        status = found[0]
    elif pixels.noise_region is not None:
        x0, y0, x1, y1 = pixels.noise_region.box
        status, values = "noise_region", {"x0": x0, "y0": y0, "x1": x1 - 1, "y1": y1 - 1}
    else:
        status = "noise"
    look = MADE_SO_LOOKS[status].format(**values)
    return FINDING_WORDS["made_so"].format(by=by, look=look, shows=_shows(status, pixels.design))


def made_so(explanation: Any) -> bool:
    """Whether the image's status is a fault's look its record does not prove (`designs`)."""
    return (
        explanation.status in ("flat", "unclaimed")
        and explanation.made_by != "unknown"
        and explanation.pixels.design is not None
    )
