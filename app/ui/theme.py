"""Colours that follow the system palette: one scheme for light desktops, one for dark, and the
style sheet built from it. Every custom colour in the window comes from here.

Window, base and text colours are the palette's own; the accents (banners, chips, links, the
chart) are chosen per scheme so that text on them keeps a WCAG contrast ratio of at least 4.5.
What a user must find to operate (the borders of fields, check boxes and radio buttons) keeps
3:1 against the window and the field (WCAG 1.4.11), and so does a disabled button's text.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QAbstractSpinBox, QApplication, QLineEdit, QProxyStyle

from app.core import paths

LEVELS = ("good", "warn", "bad", "info", "muted")
# WCAG 1.4.11: the parts of a control a user must see to find and operate it, against what is
# next to them. A disabled button's text is held to it too: dimmer than body text, still read.
CONTROL = 3.0


@dataclass(frozen=True)
class Scheme:
    """One colour scheme. Colours are "#rrggbb" strings; `banners` and `chips` map a level
    (good, warn, bad, info, muted) to (background, border, text) and (background, text)."""

    dark: bool
    window: str
    base: str
    text: str
    muted: str
    link: str
    invalid: str
    border: str  # cards and lines: decoration, deliberately quiet
    field: str  # fields, check boxes and radio buttons: CONTROL on the window and on `base`
    disabled_text: str  # a disabled button's or field's text: CONTROL on window, base, button
    banners: dict[str, tuple[str, str, str]]
    chips: dict[str, tuple[str, str]]
    primary: tuple[str, str, str, str, str]  # background, hover, text; disabled: background, text
    selected: tuple[str, str]  # navigation's selected row: background, text
    scrollbar: tuple[str, str]  # handle, handle under the mouse
    chart: dict[str, str]

    def colour(self, name: str) -> QColor:
        return QColor(getattr(self, name))


def is_dark(palette: QPalette) -> bool:
    """A dark desktop: the window colour is darker than its text."""
    window = palette.color(QPalette.ColorRole.Window)
    text = palette.color(QPalette.ColorRole.WindowText)
    return window.lightnessF() < text.lightnessF()


def scheme_for(palette: QPalette) -> Scheme:
    """The scheme for this palette: its own window, base and text colours, with accents chosen
    for a light or a dark background."""
    window = palette.color(QPalette.ColorRole.Window).name()
    base = palette.color(QPalette.ColorRole.Base).name()
    text = palette.color(QPalette.ColorRole.WindowText).name()
    # A button's face runs from the palette's button colour to half as light again (Fusion's
    # gradient on a dark one): a disabled button's text keeps CONTROL on all of it.
    button = palette.color(QPalette.ColorRole.Button)
    faces = (base, button.name(), button.lighter(150).name())
    # Headroom: a radio button's round border is antialiased, and drawn it loses a few percent.
    field = _blend(text, window, 0.45, floor=CONTROL + 0.2, against=(base,))
    disabled_text = _blend(text, window, 0.45, floor=CONTROL, against=faces)
    if is_dark(palette):
        return Scheme(
            dark=True,
            window=window,
            base=base,
            text=text,
            muted=_blend(text, window, 0.72, floor=4.6),
            link="#8ab4f8",
            invalid="#f2b8b5",
            border=_blend(text, window, 0.25),
            field=field,
            disabled_text=disabled_text,
            banners={
                "good": ("#0f3d1e", "#2f6b40", "#c4eed0"),
                "warn": ("#4a3500", "#7a5a10", "#ffe08a"),
                "bad": ("#5c1a16", "#8c3a34", "#ffdad6"),
                "info": ("#0e2f5a", "#2d5a94", "#d3e3fd"),
                "muted": ("#303134", "#5f6368", "#e8eaed"),
            },
            chips={
                "good": ("#81c995", "#0b2913"),
                "warn": ("#fdd663", "#2e2100"),
                "bad": ("#f28b82", "#3b0906"),
                "info": ("#8ab4f8", "#0a1f3f"),
                "muted": ("#9aa0a6", "#1b1c1e"),
            },
            primary=("#8ab4f8", "#aecbfa", "#0a1f3f", "#3c4a5e", "#9aa6b9"),
            selected=("#394457", "#e8eaed"),
            scrollbar=("#7a7f86", "#a8adb3"),
            chart={
                "good": "#5bb974",
                "warn": "#fbbc04",
                "bad": "#f28b82",
                "grid": _blend(text, window, 0.18),
                "axis": _blend(text, window, 0.72),
                "label_background": window,
            },
        )
    return Scheme(
        dark=False,
        window=window,
        base=base,
        text=text,
        muted=_blend(text, window, 0.70, floor=4.6),
        link="#0b57d0",
        invalid="#b3261e",
        border=_blend(text, window, 0.18),
        field=field,
        disabled_text=disabled_text,
        banners={
            "good": ("#e7f4ea", "#a8d5b2", "#0d3818"),
            "warn": ("#fff4de", "#f0cf8e", "#3d2a00"),
            "bad": ("#fdecea", "#f2b8b5", "#5c1410"),
            "info": ("#e8f0fe", "#b6cdf7", "#0b2a5c"),
            "muted": ("#f1f3f4", "#dadce0", "#202124"),
        },
        chips={
            "good": ("#1e7b34", "#ffffff"),
            "warn": ("#8f5300", "#ffffff"),
            "bad": ("#b3261e", "#ffffff"),
            "info": ("#0b57d0", "#ffffff"),
            "muted": ("#5f6368", "#ffffff"),
        },
        primary=("#0b57d0", "#0a4cb8", "#ffffff", "#d0dcf2", "#5a6f92"),
        selected=("#d3e3fd", "#041e49"),
        scrollbar=("#9aa0a6", "#6f747a"),
        chart={
            "good": "#2e8b57",
            "warn": "#e0a100",
            "bad": "#c62828",
            "grid": _blend(text, window, 0.12),
            "axis": _blend(text, window, 0.70),
            "label_background": window,
        },
    )


def style_sheet(scheme: Scheme) -> str:
    """The application's style sheet for one scheme."""
    rules = [
        'QLabel[role="title"] { font-size: 17pt; font-weight: 600; }',
        'QLabel[role="section"] { font-size: 12pt; font-weight: 600; margin-top: 8px; }',
        f'QLabel[role="help"] {{ color: {scheme.muted}; }}',
        f'QLabel[role="muted"] {{ color: {scheme.muted}; }}',
        f'QLabel[role="resolved"] {{ color: {scheme.link}; }}',
        f'QLabel[role="invalid"] {{ color: {scheme.invalid}; }}',
        f'QFrame[card="true"] {{ background: {scheme.base}; border: 1px solid {scheme.border};'
        " border-radius: 8px; }",
        # Muted text inside a card sits on the card's base colour, not the window's.
        f'QFrame[card="true"] QLabel[role="muted"] {{ color: {_on(scheme.muted, scheme)}; }}',
        'QScrollArea[plain="true"] { background: transparent; border: none; }',
        f'QFrame[role="line"] {{ color: {scheme.border}; }}',
        f"QListWidget#navigation {{ border: none; background: {scheme.window}; font-size: 11pt; }}",
        "QListWidget#navigation::item { padding: 10px 14px; }",
        f"QListWidget#navigation::item:selected {{ background: {scheme.selected[0]};"
        f" color: {scheme.selected[1]}; border-radius: 6px; }}",
    ]
    for level, (background, border, text) in scheme.banners.items():
        rules.append(
            f'QFrame[level="{level}"] {{ background: {background}; border: 1px solid {border};'
            " border-radius: 6px; }"
        )
        rules.append(
            f'QFrame[level="{level}"] > QLabel {{ color: {text}; background: transparent; }}'
        )
    for level, (background, text) in scheme.chips.items():
        rules.append(
            f'QLabel[chip="{level}"] {{ background: {background}; color: {text};'
            " border-radius: 9px; padding: 2px 9px; }"
        )
    background, hover, text, disabled, disabled_text = scheme.primary
    rules += [
        f"QPushButton:disabled {{ color: {scheme.disabled_text}; }}",
        f'QPushButton[primary="true"] {{ background: {background}; color: {text}; border: none;'
        " border-radius: 5px; padding: 6px 16px; font-weight: 600; }",
        f'QPushButton[primary="true"]:disabled {{ background: {disabled}; color: {disabled_text}; }}',
        f'QPushButton[primary="true"]:hover {{ background: {hover}; }}',
    ]
    rules += _field_rules(scheme)
    handle, hovered = scheme.scrollbar
    # Scroll bars the user can see: Fusion's default handle nearly vanishes on either scheme.
    rules += [
        "QScrollBar:vertical { background: transparent; width: 12px; margin: 0; }",
        "QScrollBar:horizontal { background: transparent; height: 12px; margin: 0; }",
        f"QScrollBar::handle {{ background: {handle}; border-radius: 4px; margin: 2px; }}",
        "QScrollBar::handle:vertical { min-height: 28px; }",
        "QScrollBar::handle:horizontal { min-width: 28px; }",
        f"QScrollBar::handle:hover {{ background: {hovered}; }}",
        "QScrollBar::add-line, QScrollBar::sub-line { width: 0; height: 0; }",
        "QScrollBar::add-page, QScrollBar::sub-page { background: none; }",
    ]
    return "\n".join(rules) + "\n"


FIELDS = ("QLineEdit", "QAbstractSpinBox", "QComboBox", "QPlainTextEdit", "QTextEdit")
# Check boxes, and the boxes a list's rows are ticked in (the first start's model folders).
BOXES = ("QCheckBox::indicator", "QAbstractItemView::indicator")
INDICATORS = (*BOXES, "QRadioButton::indicator")
# Where a spin box's text starts inside its border, as Fusion's: a style sheet's padding does not
# reach the line edit inside a spin box (ThemeFollower sets it as text margins instead).
SPIN_TEXT_INDENT = 4


def _field_rules(scheme: Scheme) -> list[str]:
    """Fields, check boxes and radio buttons with borders a user can find. Fusion draws theirs a
    shade off the window (1.2:1 on a dark one); a style sheet that sets a border draws the rest
    of the control too, so the tick, the dot and the arrows are drawn here as well."""
    accent, _hover, on_accent, disabled, on_disabled = scheme.primary
    text, dim = scheme.text, scheme.disabled_text

    def each(names: tuple[str, ...], state: str = "") -> str:
        return ", ".join(f"{name}{state}" for name in names)

    return [
        f"{each(FIELDS)} {{ background: {scheme.base}; border: 1px solid {scheme.field};"
        " border-radius: 4px; }",
        "QLineEdit, QComboBox { padding: 2px 4px; }",
        "QAbstractSpinBox { padding: 1px 0; }",
        f"{each(FIELDS, ':focus')}, QComboBox:on {{ border-color: {accent}; }}",
        f"{each(FIELDS, ':disabled')} {{ background: {scheme.window}; color: {dim}; }}",
        # The guide and the reports are read, not typed in: their frame stays a quiet one.
        f"QTextBrowser {{ border-color: {scheme.border}; }}",
        # Where a picture is dropped: it has to show where it is while it is empty.
        f"PictureSlot {{ border: 1px solid {scheme.field}; border-radius: 6px; }}",
        "QComboBox::drop-down { subcontrol-origin: border; subcontrol-position: center right;"
        " width: 20px; border: none; }",
        f"QComboBox::down-arrow {{ image: url({_picture('down', text)}); width: 10px;"
        " height: 10px; }",
        f"QComboBox::down-arrow:disabled {{ image: url({_picture('down', dim)}); }}",
        # A styled combo box draws its list's rows as its own items: without these, the row in
        # reach is drawn in the highlighted-text colour on the field's (white on white).
        f"QComboBox QAbstractItemView {{ background: {scheme.base}; color: {text};"
        f" border: 1px solid {scheme.field}; outline: none; }}",
        f"QComboBox::item:selected {{ background: {scheme.selected[0]};"
        f" color: {scheme.selected[1]}; }}",
        "QAbstractSpinBox::up-button, QAbstractSpinBox::down-button { subcontrol-origin: border;"
        " width: 14px; border: none; background: transparent; }",
        "QAbstractSpinBox::up-button { subcontrol-position: top right; }",
        "QAbstractSpinBox::down-button { subcontrol-position: bottom right; }",
        f"QAbstractSpinBox::up-arrow {{ image: url({_picture('up', text)}); width: 10px;"
        " height: 10px; }",
        f"QAbstractSpinBox::down-arrow {{ image: url({_picture('down', text)}); width: 10px;"
        " height: 10px; }",
        # :off is the arrow of a spin box at its end of the range: it does nothing.
        "QAbstractSpinBox::up-arrow:disabled, QAbstractSpinBox::up-arrow:off"
        f" {{ image: url({_picture('up', dim)}); }}",
        "QAbstractSpinBox::down-arrow:disabled, QAbstractSpinBox::down-arrow:off"
        f" {{ image: url({_picture('down', dim)}); }}",
        f"{each(INDICATORS)} {{ width: 12px; height: 12px; background: {scheme.base};"
        f" border: 1px solid {scheme.field}; }}",
        f"{each(BOXES)} {{ border-radius: 3px; }}",
        "QRadioButton::indicator { border-radius: 7px; }",
        f"{each(INDICATORS, ':hover')}, {each(INDICATORS, ':focus')} {{ border-color: {accent}; }}",
        f"{each(INDICATORS, ':disabled')} {{ background: {scheme.window}; }}",
        f"{each(BOXES, ':checked')} {{ background: {accent}; border-color: {accent};"
        f" image: url({_picture('check', on_accent)}); }}",
        f"{each(BOXES, ':indeterminate')} {{ background: {accent}; border-color: {accent};"
        f" image: url({_picture('dash', on_accent)}); }}",
        f"{each(BOXES, ':checked:disabled')}, {each(BOXES, ':indeterminate:disabled')}"
        f" {{ background: {disabled}; border-color: {disabled}; }}",
        f"{each(BOXES, ':checked:disabled')} {{ image: url({_picture('check', on_disabled)}); }}",
        f"{each(BOXES, ':indeterminate:disabled')}"
        f" {{ image: url({_picture('dash', on_disabled)}); }}",
        f"QRadioButton::indicator:checked {{ border-color: {accent};"
        f" image: url({_picture('dot', accent)}); }}",
        f"QRadioButton::indicator:checked:disabled {{ border-color: {scheme.field};"
        f" image: url({_picture('dot', dim)}); }}",
        f"QCheckBox:disabled, QRadioButton:disabled {{ color: {dim}; }}",
    ]


def dark_palette() -> QPalette:
    """A dark desktop's palette as KDE's Breeze Dark or Windows' dark mode hand one over: for
    screenshots (tools/screenshots.py --dark) and trying the dark scheme on a light desktop."""
    palette = QPalette()
    role = QPalette.ColorRole
    for name, colour in (
        (role.Window, "#202124"),
        (role.WindowText, "#e8eaed"),
        (role.Base, "#2b2c2f"),
        (role.AlternateBase, "#303134"),
        (role.Button, "#303134"),
        (role.ButtonText, "#e8eaed"),
        (role.Text, "#e8eaed"),
        (role.ToolTipBase, "#303134"),
        (role.ToolTipText, "#e8eaed"),
        (role.PlaceholderText, "#9aa0a6"),
        (role.Highlight, "#8ab4f8"),
        (role.HighlightedText, "#202124"),
        (role.Link, "#8ab4f8"),
        (role.Light, "#3c4043"),
        (role.Midlight, "#35363a"),
        (role.Mid, "#2a2b2e"),
        (role.Dark, "#18191b"),
        (role.Shadow, "#000000"),
    ):
        palette.setColor(name, QColor(colour))
    for name, colour in (
        (role.WindowText, "#80868b"),
        (role.Text, "#80868b"),
        (role.ButtonText, "#80868b"),
    ):
        palette.setColor(QPalette.ColorGroup.Disabled, name, QColor(colour))
    return palette


def current_scheme() -> Scheme:
    return scheme_for(QGuiApplication.palette())


class ThemeFollower(QObject):
    """Rebuilds the application's style sheet whenever the application's palette changes (the
    user switches between light and dark while HalfSafe runs), and gives the application its
    own style's twin that indents a spin box's text (`SpinIndentStyle`). Made once, a child of the
    QApplication. Neither is an application-wide event filter: such a filter is a Python call
    for every event of every object, which made a style-sheet change over many widgets take
    minutes."""

    def __init__(self, app: QApplication) -> None:
        super().__init__(app)
        self.app = app
        self.applied = ""
        self.style = SpinIndentStyle(app.style().name())
        app.setStyle(self.style)
        app.paletteChanged.connect(self.apply)
        self.apply()

    def apply(self, _palette: QPalette | None = None) -> None:
        sheet = style_sheet(scheme_for(self.app.palette()))
        # Setting the same sheet again would re-polish every widget alive.
        if sheet != self.applied:
            self.applied = sheet
            self.app.setStyleSheet(sheet)


class SpinIndentStyle(QProxyStyle):
    """The application's style, whose polish also sets a spin box's text margins: a style
    sheet's padding does not reach the line edit inside a spin box (`SPIN_TEXT_INDENT`)."""

    def polish(self, target, /):  # noqa: ANN001 - Qt's overloads: a widget, palette or app
        result = super().polish(target)
        if isinstance(target, QAbstractSpinBox):
            edit = target.findChild(QLineEdit)
            if edit is not None:
                edit.setTextMargins(SPIN_TEXT_INDENT, 0, 0, 0)
        return result


# Pictures the style sheet names -----------------------------------------------------------------

# A style sheet draws a check box's tick, a radio button's dot and a field's arrows only from
# files: each is an SVG in the scheme's colour, on a 12 x 12 canvas.
_SHAPES = {
    "check": '<path d="M2.5 6.4 5 8.9 9.6 3.4" fill="none" stroke="{colour}"'
    ' stroke-width="1.9" stroke-linecap="round" stroke-linejoin="round"/>',
    "dash": '<path d="M3 6h6" stroke="{colour}" stroke-width="1.9" stroke-linecap="round"/>',
    "dot": '<circle cx="6" cy="6" r="3" fill="{colour}"/>',
    "down": '<path d="M1.5 4h9L6 8.8z" fill="{colour}"/>',
    "up": '<path d="M1.5 8h9L6 3.2z" fill="{colour}"/>',
}


def _picture(shape: str, colour: str) -> str:
    """The quoted path, for a style sheet's url(), of `shape` drawn in `colour`. Written once:
    the name holds a digest of the drawing, so a file of that name is always the right one."""
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="12" height="12" viewBox="0 0 12 12">'
        + _SHAPES[shape].format(colour=colour)
        + "</svg>\n"
    )
    name = f"{shape}-{hashlib.sha1(svg.encode()).hexdigest()[:12]}.svg"
    for folder in (_pictures_folder, _spare_pictures_folder):
        with contextlib.suppress(OSError):
            path = folder() / name
            if not path.is_file():
                # Another HalfSafe may be reading this name: it appears whole or not at all.
                part = path.with_name(f"{name}.{os.getpid()}.part")
                part.write_text(svg, encoding="utf-8")
                part.replace(path)
            return f'"{path.as_posix()}"'
    # Nowhere to write: the controls keep their borders and colours, without the pictures.
    logging.getLogger("halfsafe").warning("Could not write the style sheet's %s picture.", shape)
    return '""'


@functools.cache
def _pictures_folder() -> Path:
    folder = paths.cache_dir() / "theme"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@functools.cache
def _spare_pictures_folder() -> Path:
    """A folder of this process's own, for when the cache folder cannot be written."""
    folder = Path(tempfile.mkdtemp(prefix="halfsafe-theme-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


# Colour arithmetic ----------------------------------------------------------------------------


def relative_luminance(colour: QColor | str) -> float:
    """WCAG 2 relative luminance of an sRGB colour, 0 (black) to 1 (white)."""
    colour = QColor(colour)

    def channel(value: float) -> float:
        return value / 12.92 if value <= 0.04045 else ((value + 0.055) / 1.055) ** 2.4

    return (
        0.2126 * channel(colour.redF())
        + 0.7152 * channel(colour.greenF())
        + 0.0722 * channel(colour.blueF())
    )


def contrast_ratio(foreground: QColor | str, background: QColor | str) -> float:
    """WCAG 2 contrast ratio, 1 to 21; body text needs at least 4.5."""
    first, second = relative_luminance(foreground), relative_luminance(background)
    light, dark = max(first, second), min(first, second)
    return (light + 0.05) / (dark + 0.05)


def _blend(
    foreground: str,
    background: str,
    amount: float,
    floor: float = 0.0,
    against: tuple[str, ...] = (),
) -> str:
    """`amount` of the foreground over the background; moved towards the foreground until the
    contrast with the background, and with every colour in `against`, reaches `floor`."""
    front, back = QColor(foreground), QColor(background)
    while True:
        mixed = QColor(
            round(back.red() + (front.red() - back.red()) * amount),
            round(back.green() + (front.green() - back.green()) * amount),
            round(back.blue() + (front.blue() - back.blue()) * amount),
        )
        if amount >= 1.0 or all(contrast_ratio(mixed, c) >= floor for c in (back, *against)):
            return mixed.name()
        amount = min(1.0, amount + 0.04)


def _on(colour: str, scheme: Scheme) -> str:
    """A muted colour adjusted to keep its contrast on a card's base colour too."""
    if contrast_ratio(colour, scheme.base) >= 4.6:
        return colour
    return _blend(scheme.text, scheme.base, 0.72, floor=4.6)
