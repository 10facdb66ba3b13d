"""Light and dark desktops: every view is rendered under both palettes and every piece of text
keeps a WCAG contrast ratio of at least 4.5 against what is drawn behind it; the borders of
fields, check boxes and radio buttons, and a disabled button's text, keep 3:1."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, QRect, Qt
from PySide6.QtGui import QColor, QImage, QPalette
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QStyle,
    QStyleOptionButton,
    QVBoxLayout,
    QWidget,
)

from app.engine.events import EventState
from app.ui.input_pictures import PictureSlot
from app.ui.theme import (
    CONTROL,
    SpinIndentStyle,
    contrast_ratio,
    is_dark,
    scheme_for,
    style_sheet,
)
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


def _sheet() -> str:
    """The style sheet the application has now."""
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    return app.styleSheet()


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
    assert _sheet() == style_sheet(scheme)


def test_every_accent_keeps_body_text_contrast(scheme_name):
    scheme = scheme_for(QApplication.palette())
    pairs = {f"banner {k}": (t, b) for k, (b, _border, t) in scheme.banners.items()}
    pairs |= {f"chip {k}": (t, b) for k, (b, t) in scheme.chips.items()}
    pairs |= {
        "muted": (scheme.muted, scheme.window),
        "muted on a card": (scheme.muted, scheme.base),
        "link": (scheme.link, scheme.window),
        "invalid": (scheme.invalid, scheme.window),
        "primary button": (scheme.primary[2], scheme.primary[0]),
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


# Controls: what a user must find to operate keeps 3:1 (WCAG 1.4.11) ---------------------------

FIELDS = ("QLineEdit", "QAbstractSpinBox", "QComboBox", "QPlainTextEdit", "QTextEdit")
PRIMARY = 'QPushButton[primary="true"]'


def _declared(selector: str, name: str) -> str:
    """What the application's style sheet gives `name` for exactly `selector`, as it cascades:
    the last rule listing the selector wins (the sheet's rules for one selector are equally
    specific), and a `border` shorthand counts as its colour."""
    found = ""
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", _sheet()):
        if selector not in (each.strip() for each in selectors.split(",")):
            continue
        for declaration in body.split(";"):
            key, _colon, value = (part.strip() for part in declaration.partition(":"))
            if key == name:
                found = value
            elif key == "border" and name == "border-color":
                found = value.split()[-1]
    assert found, f"the style sheet gives {selector} no {name}"
    return found


def _picture_colour(selector: str) -> str:
    """The colour of the picture (a tick, a dot) the style sheet draws for `selector`."""
    path = Path(_declared(selector, "image").removeprefix("url(").removesuffix(")").strip('"'))
    assert path.is_file(), f"{selector}'s picture {path} is missing"
    assert not QImage(str(path)).isNull(), f"{selector}'s picture {path} does not load"
    colours = set(re.findall(r'(?:fill|stroke)="(#[0-9a-f]{6})"', path.read_text()))
    assert len(colours) == 1, f"{path} has colours {colours}"
    return colours.pop()


def _poor(pairs: dict[str, tuple[str, str]]) -> dict[str, float]:
    ratios = {name: contrast_ratio(*pair) for name, pair in pairs.items()}
    return {name: round(ratio, 2) for name, ratio in ratios.items() if ratio < CONTROL}


def _behind(scheme) -> dict[str, str]:
    """Where a control sits: on the window, or on a card (the base colour, as a field's own)."""
    return {"window": scheme.window, "card": scheme.base}


def test_check_boxes_and_radio_buttons_stand_out(scheme_name):
    scheme = scheme_for(QApplication.palette())
    pairs = {}
    for indicator in (
        "QCheckBox::indicator",
        "QAbstractItemView::indicator",  # a list's rows ticked, as the first start's folders
        "QRadioButton::indicator",
    ):
        for state in ("", ":checked"):
            for where, colour in _behind(scheme).items():
                border = _declared(indicator + state, "border-color")
                pairs[f"{indicator}{state} border on the {where}"] = (border, colour)
    checked_box = "QCheckBox::indicator:checked"
    for where, colour in _behind(scheme).items():
        pairs[f"checked box on the {where}"] = (_declared(checked_box, "background"), colour)
    pairs["tick"] = (_picture_colour(checked_box), _declared(checked_box, "background"))
    pairs["dot"] = (
        _picture_colour("QRadioButton::indicator:checked"),
        _declared("QRadioButton::indicator", "background"),
    )
    assert _poor(pairs) == {}


def test_fields_show_their_borders(scheme_name):
    scheme = scheme_for(QApplication.palette())
    pairs = {}
    for where, colour in _behind(scheme).items():
        # PictureSlot: the input picture's drop area, which is all border while it is empty.
        for field in (*FIELDS, "PictureSlot"):
            pairs[f"{field} on the {where}"] = (_declared(field, "border-color"), colour)
        for field in FIELDS:
            focused = _declared(f"{field}:focus", "border-color")
            pairs[f"{field} with focus on the {where}"] = (focused, colour)
    assert _poor(pairs) == {}


def test_a_disabled_button_stays_readable_and_looks_disabled(scheme_name):
    palette = QApplication.palette()
    button = palette.color(QPalette.ColorRole.Button)
    enabled = palette.color(QPalette.ColorRole.ButtonText).name()
    disabled = _declared("QPushButton:disabled", "color")
    # Each: the disabled text and its face, the enabled text and its face. A button's face runs
    # from the palette's button colour to half as light again (Fusion's gradient).
    cases = {
        f"button on {face}": (disabled, face, enabled, face)
        for face in (button.name(), button.lighter(150).name())
    }
    cases["primary button"] = (
        _declared(f"{PRIMARY}:disabled", "color"),
        _declared(f"{PRIMARY}:disabled", "background"),
        _declared(PRIMARY, "color"),
        _declared(PRIMARY, "background"),
    )
    problems = {}
    for name, (text, face, enabled_text, enabled_face) in cases.items():
        ratio, enabled_ratio = (
            contrast_ratio(text, face),
            contrast_ratio(enabled_text, enabled_face),
        )
        # Readable, and visibly dimmer than the enabled button's text.
        if ratio < CONTROL or ratio * 1.5 > enabled_ratio:
            problems[name] = (round(ratio, 2), round(enabled_ratio, 2))
    assert problems == {}


# The same, as drawn: pixels of controls rendered with the application's style sheet ------------


def _render(*widgets: QWidget) -> tuple[QWidget, QImage]:
    """The widgets in a column, drawn in the application's style made from Fusion (whatever the
    machine's own style) and at rest (none has the focus, which would draw its border in the
    accent), and the picture of them."""
    panel = QWidget()
    column = QVBoxLayout(panel)
    for widget in widgets:
        column.addWidget(widget)
    fusion = SpinIndentStyle("Fusion")
    fusion.setParent(panel)
    for widget in (panel, *panel.findChildren(QWidget)):
        widget.setStyle(fusion)
        widget.setFocusPolicy(Qt.FocusPolicy.NoFocus)
    panel.resize(320, panel.sizeHint().height())
    panel.show()
    QApplication.processEvents()
    image = panel.grab().toImage()
    panel.hide()
    return panel, image


def _colours(image: QImage, rect: QRect) -> Counter[str]:
    counts: Counter[str] = Counter()
    for x in range(rect.left(), rect.right() + 1):
        for y in range(rect.top(), rect.bottom() + 1):
            counts[QColor(image.pixel(x, y)).name()] += 1
    return counts


def _distance(first: str, second: str) -> int:
    a, b = QColor(first), QColor(second)
    return max(abs(a.red() - b.red()), abs(a.green() - b.green()), abs(a.blue() - b.blue()))


def _indicator(box: QCheckBox | QRadioButton, panel: QWidget) -> QRect:
    option = QStyleOptionButton()
    box.initStyleOption(option)
    element = (
        QStyle.SubElement.SE_CheckBoxIndicator
        if isinstance(box, QCheckBox)
        else QStyle.SubElement.SE_RadioButtonIndicator
    )
    rect = box.style().subElementRect(element, option, box)
    return rect.translated(box.mapTo(panel, rect.topLeft()) - rect.topLeft())


def test_unchecked_boxes_and_empty_fields_are_drawn_where_a_user_can_see_them(scheme_name):
    scheme = scheme_for(QApplication.palette())
    window, base = scheme.window, scheme.base
    boxes = [QCheckBox("Only masked"), QRadioButton("Auto")]
    folders = QListWidget()
    folders.setFixedHeight(40)
    folder = QListWidgetItem("/mnt/models")
    folder.setFlags(folder.flags() | Qt.ItemFlag.ItemIsUserCheckable)
    folder.setCheckState(Qt.CheckState.Unchecked)
    folders.addItem(folder)
    prompt = QPlainTextEdit()
    prompt.setFixedHeight(40)
    fields = [QLineEdit(), QSpinBox(), QComboBox(), prompt, PictureSlot("Picture", "")]
    panel, image = _render(*boxes, *fields, folders)
    faint = {}
    for box in boxes:
        strongest = max(contrast_ratio(c, window) for c in _colours(image, _indicator(box, panel)))
        if strongest < CONTROL:
            faint[type(box).__name__] = round(strongest, 2)
    for field in fields:
        # The field's left edge at half its height: its border, clear of the corners.
        middle = field.mapTo(panel, field.rect().topLeft()).y() + field.height() // 2
        edge = QRect(field.mapTo(panel, field.rect().topLeft()).x(), middle, 3, 1)
        strongest = max(contrast_ratio(c, window) for c in _colours(image, edge))
        if strongest < CONTROL:
            faint[type(field).__name__] = round(strongest, 2)
    # An unticked row's box, on the list's own colour: the row's start, before its text.
    row = folders.visualItemRect(folders.item(0))
    box = QRect(folders.viewport().mapTo(panel, row.topLeft()), row.size())
    box.setWidth(row.height())
    strongest = max(contrast_ratio(c, base) for c in _colours(image, box))
    if strongest < CONTROL:
        faint["unticked row"] = round(strongest, 2)
    assert faint == {}


def test_a_checked_box_shows_its_tick(scheme_name):
    box = QCheckBox("Only masked")
    box.setChecked(True)
    panel, image = _render(box)
    colours = _colours(image, _indicator(box, panel).adjusted(1, 1, -1, -1))
    fill = colours.most_common(1)[0][0]
    assert max(contrast_ratio(c, fill) for c in colours) >= CONTROL


@pytest.mark.qt_log_ignore("propagateSizeHints", "does not support raise", "grabbing the keyboard")
def test_a_combo_box_list_shows_the_row_in_reach(scheme_name):
    """A styled combo box draws its list's rows as its own items; the highlighted one keeps
    body-text contrast (unstyled, it is the highlighted-text colour on the field's)."""
    combo = QComboBox()
    combo.addItems(["Auto", "fp16 (half)", "fp32 (full)"])
    panel, _image = _render(combo)
    panel.show()
    combo.showPopup()
    QApplication.processEvents()
    view = combo.view()
    row = view.viewport().grab(view.visualRect(view.model().index(0, 0))).toImage()
    combo.hidePopup()
    colours = _colours(row, row.rect())
    background = colours.most_common(1)[0][0]
    assert max(contrast_ratio(c, background) for c in colours) >= BODY_TEXT


def test_disabled_button_text_is_drawn_readable(scheme_name):
    """Against every colour the button's face is drawn in, in Fusion's gradient too."""
    plain, primary = QPushButton("Cancel"), QPushButton("Run health check")
    primary.setProperty("primary", True)
    for button in (plain, primary):
        button.setEnabled(False)
    panel, image = _render(plain, primary)
    poor = {}
    for button, text in (
        (plain, _declared("QPushButton:disabled", "color")),
        (primary, _declared(f"{PRIMARY}:disabled", "color")),
    ):
        inside = QRect(button.mapTo(panel, button.rect().topLeft()), button.size())
        colours = _colours(image, inside.adjusted(3, 3, -3, -3))
        drawn = max(colours, key=lambda c: contrast_ratio(c, colours.most_common(1)[0][0]))
        assert _distance(drawn, text) < 24, f"{button.text()} is drawn in {drawn}, not {text}"
        # The face: every colour that fills a twentieth of the button, other than the text's.
        share = sum(colours.values()) / 20
        faces = (c for c, n in colours.items() if n >= share and _distance(c, text) >= 24)
        for face in faces:
            if contrast_ratio(text, face) < CONTROL:
                poor[f"{button.text()} on {face}"] = round(contrast_ratio(text, face), 2)
    assert poor == {}


def test_a_spin_box_keeps_its_text_clear_of_its_border(scheme_name):
    """A style sheet's padding does not reach the line edit inside a spin box; without the
    theme's text margin its digits would touch the border."""
    spin = QSpinBox()
    spin.setValue(4)
    panel, _image = _render(spin)
    edit = spin.findChild(QLineEdit)
    assert edit is not None
    edit.setCursorPosition(0)
    assert edit.mapTo(spin, edit.cursorRect().center()).x() >= 4


def test_the_theme_watches_no_event_of_any_widget(scheme_name):
    """The style sheet follows the palette through the application's own signal, and spin boxes
    get their margin from the style: an application-wide event filter is a Python call for
    every event of every object, and re-polishing a few hundred widgets through one took
    minutes."""
    from app.ui.theme import ThemeFollower

    app = QApplication.instance()
    assert isinstance(app, QApplication)
    follower = app.findChild(ThemeFollower)
    assert follower is not None
    assert type(follower).eventFilter is QObject.eventFilter
    assert isinstance(follower.style, SpinIndentStyle)
