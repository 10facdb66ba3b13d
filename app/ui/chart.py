"""A bar chart of max |activation| per block against the fp16 limit, on a log scale.

Drawn with QPainter (PySide6-Essentials has no QtCharts). Bars are green far below the limit,
amber within a factor of ten of it, red at or past it; a block that went non-finite is a red
hatched bar reaching the top.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import (
    QBrush,
    QColor,
    QFont,
    QFontMetrics,
    QHelpEvent,
    QPainter,
    QPen,
    QTransform,
)
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from app.core.health.report import BlockPeak
from app.ui.theme import scheme_for
from app.ui.words import FP16_LIMIT, big_number, short_block

# How far under the axis a block's name starts, in pixels.
_LABEL_DROP = 6


@dataclass(frozen=True)
class ChartLayout:
    """Where a chart puts everything, in widget coordinates: the plot, its decades, the limit's
    line and caption, each bar, the words over a bar (a rectangle and its text; None: none),
    and each block's name (its anchor, its text, the rectangle its slanted text covers)."""

    plot: QRectF
    decades: tuple[int, int]
    limit_y: float
    limit_caption: QRectF
    bars: list[QRectF]
    captions: list[tuple[QRectF, str] | None]
    labels: list[tuple[QPointF, str, QRectF]]


def _fitting(
    metrics: QFontMetrics, texts: tuple[str, ...], room: QRectF
) -> tuple[QRectF, str] | None:
    """The first of `texts` that fits across `room`, with the part of `room` it takes; None
    where none fits (the bar's tooltip still says it)."""
    for text in texts:
        width = metrics.horizontalAdvance(text) + 2
        if width <= room.width():
            return QRectF(room.center().x() - width / 2, room.top(), width, room.height()), text
    return None


def _tick_label(exponent: int) -> str:
    value = 10.0**exponent
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= threshold:
            return f"{value / threshold:g}{suffix}"
    return f"{value:g}"


class ActivationChart(QWidget):
    """Shows one component's blocks in execution order; hover a bar for its full name.

    Every label has its place worked out before painting (`chart_layout`), inside the widget
    and clear of the bars: the fp16 limit's caption sits past the plot's right edge, at the end
    of its line, and each block's slanted name is shortened to the room it has."""

    MARGIN_LEFT = 52
    MARGIN_TOP = 22
    LABEL_SPACE = 74
    PLOT_HEIGHT = 150
    LABEL_ANGLE = -40.0  # degrees: the block names rise to the right

    def __init__(self, parent: QWidget | None = None, limit: float = FP16_LIMIT) -> None:
        super().__init__(parent)
        self.limit = limit
        self.blocks: list[BlockPeak] = []
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMouseTracking(True)

    def set_blocks(self, blocks: list[BlockPeak]) -> None:
        self.blocks = list(blocks)
        bad = [b.module for b in self.blocks if b.level == "bad"]
        peak = max((b.max_abs for b in self.blocks if b.max_abs is not None), default=None)
        self.setAccessibleName("Largest activation per block against the fp16 limit")
        self.setAccessibleDescription(
            f"{len(self.blocks)} blocks; largest value {big_number(peak)}; "
            + (f"past the limit: {', '.join(bad)}" if bad else "none past the limit")
        )
        self._fit_height()

    def _fit_height(self) -> None:
        self.setFixedHeight(self.sizeHint().height())
        self.updateGeometry()
        self.update()

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        # The room under the axis and past the plot is measured in the font: a new font (a
        # style sheet, a theme) needs a new height, or the names would be cut off.
        if event.type() == QEvent.Type.FontChange:
            self._fit_height()
        super().changeEvent(event)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        height = math.ceil(self.MARGIN_TOP + self.PLOT_HEIGHT + self._label_space())
        width = 46 * len(self.blocks) + self.MARGIN_LEFT + math.ceil(self._margin_right())
        return QSize(max(360, width), height)

    # Geometry ---------------------------------------------------------------------------------

    def _range(self) -> tuple[int, int]:
        values = [b.max_abs for b in self.blocks if b.max_abs is not None and b.max_abs > 0]
        low = min(values, default=1.0)
        high = max([*values, self.limit])
        # A quarter of a decade under the smallest bar at least: one of exactly 1 (a sinusoidal
        # time embedding's largest value) stood on an axis starting at 1 with no height.
        low_exp = max(-3, math.floor(math.log10(low) - 0.25))
        high_exp = math.ceil(math.log10(high) + 0.25)
        if high_exp - low_exp < 3:
            low_exp = high_exp - 3
        return low_exp, high_exp

    def _small_font(self) -> QFont:
        small = QFont(self.font())
        small.setPointSizeF(max(7.0, self.font().pointSizeF() - 1.5))
        return small

    def _limit_caption(self) -> tuple[str, str]:
        return "fp16 limit", big_number(self.limit)

    def _margin_right(self) -> float:
        """Room past the plot for the limit's caption, at the end of its line."""
        metrics = QFontMetrics(self._small_font())
        return max(metrics.horizontalAdvance(line) for line in self._limit_caption()) + 12

    def _label_extent(self, text_width: float) -> QRectF:
        """Where a block name `text_width` wide falls, relative to its anchor under its bar
        (the name ends at the anchor and slants down to the left)."""
        height = QFontMetrics(self._small_font()).height()
        turn = QTransform().rotate(self.LABEL_ANGLE)
        return turn.mapRect(QRectF(-text_width, -height / 2, text_width, height))

    def _label_space(self) -> float:
        """Room under the axis for the slanted block names: as much as the longest needs."""
        metrics = QFontMetrics(self._small_font())
        widest = max(
            (metrics.horizontalAdvance(short_block(b.module)) for b in self.blocks), default=0
        )
        widest = min(widest, self.LABEL_SPACE + 12)
        return max(24.0, _LABEL_DROP + self._label_extent(widest).bottom() + 3)

    def _plot_rect(self) -> QRectF:
        return QRectF(
            self.MARGIN_LEFT,
            self.MARGIN_TOP,
            max(10, self.width() - self.MARGIN_LEFT - self._margin_right()),
            max(10, self.height() - self.MARGIN_TOP - self._label_space()),
        )

    def _y(self, value: float, plot: QRectF, low_exp: int, high_exp: int) -> float:
        exponent = math.log10(max(value, 10.0**low_exp))
        fraction = (exponent - low_exp) / (high_exp - low_exp)
        return plot.bottom() - fraction * plot.height()

    def _bar_rects(self, plot: QRectF) -> list[tuple[float, float]]:
        """(centre x, width) per bar."""
        count = len(self.blocks)
        if not count:
            return []
        slot = plot.width() / count
        width = max(4.0, min(34.0, slot * 0.66))
        return [(plot.left() + slot * (i + 0.5), width) for i in range(count)]

    def chart_layout(self) -> ChartLayout:
        """Where everything goes at the widget's present size, in widget coordinates."""
        plot = self._plot_rect()
        low_exp, high_exp = self._range()
        metrics = QFontMetrics(self._small_font())
        line = metrics.height()
        slot = plot.width() / len(self.blocks) if self.blocks else plot.width()
        bars: list[QRectF] = []
        captions: list[tuple[QRectF, str] | None] = []
        labels: list[tuple[QPointF, str, QRectF]] = []
        for block, (centre, width) in zip(self.blocks, self._bar_rects(plot), strict=True):
            if block.non_finite:
                bars.append(QRectF(centre - width / 2, plot.top(), width, plot.height()))
                above = QRectF(centre - slot / 2, plot.top() - line - 2, slot, line)
                captions.append(_fitting(metrics, ("inf/NaN", "NaN"), above))
            elif block.max_abs is None:
                bars.append(QRectF(centre - width / 2, plot.bottom(), width, 0))
                captions.append(
                    _fitting(
                        metrics,
                        ("n/a",),
                        QRectF(centre - slot / 2, plot.bottom() - line - 2, slot, line),
                    )
                )
            else:
                top = self._y(block.max_abs, plot, low_exp, high_exp)
                bars.append(QRectF(centre - width / 2, top, width, plot.bottom() - top))
                captions.append(None)
            # A name as long as fits between the widget's left edge and its anchor.
            anchor = QPointF(centre + 4, plot.bottom() + _LABEL_DROP)
            room = self.LABEL_SPACE + 12.0
            while room > 0 and anchor.x() + self._label_extent(room).left() < 0:
                room -= 4
            text = metrics.elidedText(
                short_block(block.module), Qt.TextElideMode.ElideRight, max(0, int(room))
            )
            extent = self._label_extent(metrics.horizontalAdvance(text))
            labels.append((anchor, text, extent.translated(anchor)))
        limit_y = self._y(self.limit, plot, low_exp, high_exp)
        widest = max(metrics.horizontalAdvance(t) for t in self._limit_caption())
        box = QRectF(plot.right() + 4, limit_y - line, widest + 6, 2 * line)
        box.moveTop(min(max(0.0, box.top()), self.height() - box.height()))
        return ChartLayout(plot, (low_exp, high_exp), limit_y, box, bars, captions, labels)

    # Painting ---------------------------------------------------------------------------------

    def paintEvent(self, _event: Any) -> None:  # noqa: N802 - Qt's name
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        layout = self.chart_layout()
        plot = layout.plot
        low_exp, high_exp = layout.decades
        small = self._small_font()
        painter.setFont(small)
        # Colours from the palette this chart is drawn with, light or dark.
        colours = scheme_for(self.palette()).chart
        good, warn, bad = (QColor(colours[k]) for k in ("good", "warn", "bad"))
        grid, axis = QColor(colours["grid"]), QColor(colours["axis"])

        # Decade grid and its labels.
        for exponent in range(low_exp, high_exp + 1):
            y = self._y(10.0**exponent, plot, low_exp, high_exp)
            painter.setPen(QPen(grid, 1))
            painter.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
            painter.setPen(axis)
            text = _tick_label(exponent)
            painter.drawText(
                QRectF(0, y - 8, self.MARGIN_LEFT - 6, 16),
                Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                text,
            )
        painter.setPen(QPen(axis, 1))
        painter.drawLine(QPointF(plot.left(), plot.top()), QPointF(plot.left(), plot.bottom()))
        painter.drawLine(QPointF(plot.left(), plot.bottom()), QPointF(plot.right(), plot.bottom()))
        painter.save()
        painter.translate(11, plot.center().y())
        painter.rotate(-90)
        painter.drawText(
            QRectF(-plot.height() / 2, -8, plot.height(), 16),
            Qt.AlignmentFlag.AlignCenter,
            "max |activation| (log)",
        )
        painter.restore()

        if not self.blocks:
            painter.drawText(plot, Qt.AlignmentFlag.AlignCenter, "No per-block measurements.")

        # Bars, and the words over a bar that has no height to show.
        for block, rect, caption in zip(self.blocks, layout.bars, layout.captions, strict=True):
            if block.non_finite:
                painter.fillRect(rect, QColor(bad.red(), bad.green(), bad.blue(), 60))
                painter.fillRect(rect, QBrush(bad, Qt.BrushStyle.BDiagPattern))
            elif block.max_abs is not None:
                painter.fillRect(rect, {"good": good, "warn": warn, "bad": bad}[block.level])
            if caption is not None:
                painter.setPen(bad if block.non_finite else axis)
                painter.drawText(caption[0], Qt.AlignmentFlag.AlignCenter, caption[1])

        # The fp16 limit, drawn over the bars so it stays visible; its caption past their end.
        painter.setPen(QPen(bad, 1.6, Qt.PenStyle.DashLine))
        painter.drawLine(
            QPointF(plot.left(), layout.limit_y), QPointF(plot.right(), layout.limit_y)
        )
        painter.setPen(bad)
        painter.drawText(
            layout.limit_caption,
            Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
            "\n".join(self._limit_caption()),
        )

        # Block names, slanted so that long ones fit.
        painter.setPen(axis)
        height = QFontMetrics(small).height()
        for anchor, text, _bounds in layout.labels:
            painter.save()
            painter.translate(anchor)
            painter.rotate(self.LABEL_ANGLE)
            painter.drawText(
                QRectF(-self.LABEL_SPACE - 20, -height / 2, self.LABEL_SPACE + 20, height),
                Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                text,
            )
            painter.restore()
        painter.end()

    # Hover ------------------------------------------------------------------------------------

    def block_at(self, x: float) -> BlockPeak | None:
        plot = self._plot_rect()
        for block, (centre, width) in zip(self.blocks, self._bar_rects(plot), strict=True):
            if abs(x - centre) <= max(width / 2, 6):
                return block
        return None

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            help_event = cast(QHelpEvent, event)
            block = self.block_at(help_event.pos().x())
            if block is None:
                QToolTip.hideText()
            else:
                if block.non_finite:
                    value = "went non-finite (inf or NaN)"
                elif block.max_abs is None:
                    value = "not measured"
                else:
                    value = (
                        f"{big_number(block.max_abs)}, "
                        f"{block.max_abs / self.limit:.1%} of the fp16 limit"
                    )
                QToolTip.showText(
                    help_event.globalPos(), f"{block.module}\nmax |activation|: {value}", self
                )
            return True
        return super().event(event)
