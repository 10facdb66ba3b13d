"""Light and dark desktops: every view is rendered under both palettes and every piece of text
keeps a WCAG contrast ratio of at least 4.5 against what is drawn behind it."""

from __future__ import annotations

from collections import Counter

import pytest
from PySide6.QtCore import QRect
from PySide6.QtGui import QColor, QImage, QPalette
from PySide6.QtWidgets import QApplication, QLabel

from app.engine.events import EventState
from app.ui.theme import contrast_ratio, is_dark, scheme_for, style_sheet
from tests.support import reports
from tests.support.reports import gtx_1660_super
from tests.ui.conftest import load_fake_model

BODY_TEXT = 4.5


def light_palette() -> QPalette:
    return _palette("#efefef", "#ffffff", "#1f1f1f", "#e6e6e6")


def dark_palette() -> QPalette:
    """A dark desktop's palette, as KDE's Breeze Dark or Windows' dark mode hand it over."""
    return _palette("#202124", "#2b2c2f", "#e8eaed", "#303134")


def _palette(window: str, base: str, text: str, button: str) -> QPalette:
    palette = QPalette()
    role = QPalette.ColorRole
    for name, colour in (
        (role.Window, window),
        (role.Base, base),
        (role.AlternateBase, button),
        (role.Button, button),
        (role.WindowText, text),
        (role.Text, text),
        (role.ButtonText, text),
        (role.ToolTipBase, base),
        (role.ToolTipText, text),
        (role.PlaceholderText, QColor(text).darker(150).name() if base != "#ffffff" else "#6f6f6f"),
        (role.Highlight, "#3d7bd9"),
        (role.HighlightedText, "#ffffff"),
    ):
        palette.setColor(name, QColor(colour))
    return palette


@pytest.fixture(params=["light", "dark"])
def scheme_name(request, qapp):
    from app.ui.application import application

    application()
    original = QApplication.palette()
    QApplication.setPalette(light_palette() if request.param == "light" else dark_palette())
    yield request.param
    QApplication.setPalette(original)


def _background(image: QImage, rect: QRect) -> QColor:
    """The colour most of the label's area is painted in: what its text sits on."""
    counts: Counter[int] = Counter()
    step_x = max(1, rect.width() // 40)
    step_y = max(1, rect.height() // 12)
    for x in range(rect.left(), rect.right() + 1, step_x):
        for y in range(rect.top(), rect.bottom() + 1, step_y):
            if 0 <= x < image.width() and 0 <= y < image.height():
                counts[image.pixel(x, y)] += 1
    return QColor.fromRgb(counts.most_common(1)[0][0])


def _poor_contrast(window) -> list[str]:
    QApplication.processEvents()
    image = window.grab().toImage()
    problems = []
    for text_label in window.findChildren(QLabel):
        if not text_label.isVisible() or not text_label.text().strip():
            continue
        if not text_label.isEnabled() or text_label.width() < 4 or text_label.height() < 4:
            continue
        page = window.pages.currentWidget()
        if text_label.window() is not window or (
            page.isAncestorOf(text_label) is False and window.pages.isAncestorOf(text_label)
        ):
            continue
        # Only the part on screen: a label scrolled partly out of its page's viewport is
        # clipped there, and what shows beside the viewport is another widget's.
        visible = text_label.visibleRegion().boundingRect()
        if visible.width() < 4 or visible.height() < 4:
            continue
        top_left = text_label.mapTo(window, visible.topLeft())
        rect = QRect(top_left, visible.size()).intersected(window.rect())
        if rect.isEmpty():
            continue
        foreground = text_label.palette().color(text_label.foregroundRole())
        background = _background(image, rect)
        ratio = contrast_ratio(foreground, background)
        if ratio < BODY_TEXT:
            problems.append(
                f"{text_label.text()[:50]!r}: {foreground.name()} on {background.name()}"
                f" = {ratio:.2f}"
            )
    return problems


def test_the_scheme_follows_the_palette(scheme_name):
    palette = QApplication.palette()
    scheme = scheme_for(palette)
    assert scheme.dark is (scheme_name == "dark") is is_dark(palette)
    assert scheme.window == palette.color(QPalette.ColorRole.Window).name()
    assert QApplication.instance().styleSheet() == style_sheet(scheme)


def test_every_accent_keeps_body_text_contrast(scheme_name):
    scheme = scheme_for(QApplication.palette())
    pairs = {f"banner {k}": (t, b) for k, (b, _border, t) in scheme.banners.items()}
    pairs |= {f"chip {k}": (t, b) for k, (b, t) in scheme.chips.items()}
    pairs |= {
        "muted": (scheme.muted, scheme.window),
        "muted on a card": (scheme.muted, scheme.base),
        "link": (scheme.link, scheme.window),
        "invalid": (scheme.invalid, scheme.window),
        "primary button": (scheme.primary[3], scheme.primary[0]),
        "selected page": (scheme.selected[1], scheme.selected[0]),
        "chart axis": (scheme.chart["axis"], scheme.base),
    }
    poor = {k: round(contrast_ratio(*v), 2) for k, v in pairs.items() if contrast_ratio(*v) < 4.5}
    assert poor == {}


def test_every_view_is_readable(scheme_name, window, engines):
    load_fake_model(window, engines)
    window.show_page("Devices")
    engines.current.emit(
        engines.current.last_job("hardware"), EventState.RESULT, result=gtx_1660_super()
    )
    window.show_page("Health check")
    window.health_view.show_report(reports.fixable(), reports.MARKDOWN)
    window.generate_view.add_result(
        reports.generation(
            {
                "images": [
                    reports.image(
                        "",
                        "nan",
                        seed=5,
                        component="vae",
                        step=8,
                        message="The VAE went NaN.",
                        fix={"vae_precision": "fp32"},
                    )
                ],
                "settings": {"precision": "fp16"},
            }
        ),
        {"prompt": "a cat", "steps": 8, "width": 128, "height": 128},
    )
    window.engine_banner.show_message("bad", "<b>The engine stopped.</b> It was killed.")
    problems = {}
    for page in ("Models", "Health check", "Generate", "Devices", "Settings"):
        window.show_page(page)
        found = _poor_contrast(window)
        if found:
            problems[page] = found
    assert problems == {}
