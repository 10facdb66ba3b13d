"""The banner's words for one image, without a window: what it says, in what colour, and which
buttons it offers."""

from __future__ import annotations

from app.ui.image_entry import GalleryEntry
from app.ui.result_banner import banner_words

FIX = {"vae_precision": "fp32"}


def test_a_nan_image_with_a_fix_offers_to_apply_it_and_regenerate():
    entry = GalleryEntry(
        path="/out/00001-7.png", status="nan", step=8, message="The VAE overflowed.", fix=FIX
    )
    said = banner_words(entry)
    assert said is not None
    assert said.level == "bad"
    assert said.text.startswith("<b>NaN at step 8.</b> The VAE overflowed.")
    assert "health check" not in said.text  # the fix is one click away
    assert said.actions == (("Apply fix and regenerate", "apply_fix"),)


def test_a_nan_image_without_a_fix_points_to_the_health_check():
    said = banner_words(GalleryEntry(path="/out/00001-7.png", status="nan"))
    assert said is not None
    assert said.text.startswith("<b>This image went NaN (black).</b>")
    assert "Run the health check" in said.text
    assert said.actions == ()


def test_an_unsaved_image_says_not_saved_above_any_diagnosis():
    said = banner_words(GalleryEntry(png=b"\x89PNG", status="nan", fix=FIX))
    assert said is not None
    assert said.level == "bad"
    assert "Not saved" in said.text
    assert said.actions == (("Save as…", "save_as"),)


def test_a_fine_image_has_no_banner():
    assert banner_words(GalleryEntry(path="/out/00001-7.png", seed=7)) is None
