"""The activation chart lays its words out where they can be read: inside the widget, and
clear of the bars."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QRectF
from PySide6.QtGui import QFont

from app.core.health.report import BlockPeak
from app.ui.chart import ActivationChart

# The demo's VAE as the health check reports it: three blocks far below the limit, then every
# block from the first up-sampling one on non-finite. The last bar reaches the top of the plot,
# under the end of the limit's line.
DEMO_VAE = [
    BlockPeak("post_quant_conv", 4.2),
    BlockPeak("decoder.conv_in", 9.1),
    BlockPeak("decoder.mid_block", 16.8),
    *(
        BlockPeak(f"decoder.{name}", None, True)
        for name in (
            "up_blocks.0",
            "up_blocks.1",
            "up_blocks.2",
            "up_blocks.3",
            "conv_norm_out",
            "conv_act",
            "conv_out",
        )
    ),
]
# A denoiser's many blocks, some of them long names.
UNET = [
    BlockPeak(f"{part}.{i}.attentions.{j}", 10.0 ** (i + j))
    for part in ("down_blocks", "up_blocks")
    for i in range(4)
    for j in range(3)
]


def _chart(qtbot, blocks, width: int) -> ActivationChart:
    chart = ActivationChart()
    qtbot.addWidget(chart)
    chart.set_blocks(blocks)
    chart.resize(width, chart.height())
    return chart


# The chart's width in a card at 1920x1080, at 1024x700, and on a narrow card.
@pytest.mark.parametrize("width", [1640, 760, 420])
@pytest.mark.parametrize("blocks", [DEMO_VAE, UNET], ids=["vae", "unet"])
def test_the_limit_caption_is_clear_of_every_bar_and_inside_the_chart(qtbot, blocks, width):
    chart = _chart(qtbot, blocks, width)
    layout = chart.chart_layout()
    whole = QRectF(chart.rect())
    caption = layout.limit_caption
    assert whole.contains(caption)
    for module, bar in zip(chart.blocks, layout.bars, strict=True):
        assert not caption.intersects(bar), f"the limit's caption covers {module.module}"
    for words in filter(None, layout.captions):
        assert not caption.intersects(words[0])
    # It is at the end of the line it names.
    assert caption.left() >= layout.plot.right()
    assert caption.top() <= layout.limit_y <= caption.bottom()
    assert not chart.grab().isNull()


@pytest.mark.parametrize("width", [1640, 760, 420])
@pytest.mark.parametrize("blocks", [DEMO_VAE, UNET], ids=["vae", "unet"])
def test_every_block_name_lies_inside_the_chart(qtbot, blocks, width):
    chart = _chart(qtbot, blocks, width)
    whole = QRectF(chart.rect())
    labels = chart.chart_layout().labels
    assert len(labels) == len(blocks)
    for _anchor, text, covers in labels:
        assert text, "a name elided to nothing"
        assert whole.contains(covers), f"{text!r} at {covers} is cut off the chart ({whole})"


def test_the_words_over_bars_never_overlap_one_another(qtbot):
    for width in (1640, 760, 420):
        layout = _chart(qtbot, DEMO_VAE, width).chart_layout()
        shown = [rect for rect, _text in filter(None, layout.captions)]
        assert shown, "no bar says it went non-finite"
        for left, right in zip(shown, shown[1:], strict=False):
            assert left.right() <= right.left()


def test_a_larger_font_makes_room_for_the_names(qtbot):
    chart = _chart(qtbot, DEMO_VAE, 760)
    before = chart.height()
    font = QFont(chart.font())
    font.setPointSizeF(font.pointSizeF() * 1.6)
    chart.setFont(font)
    assert chart.height() > before
    whole = QRectF(chart.rect())
    assert all(whole.contains(covers) for _a, _t, covers in chart.chart_layout().labels)


@pytest.mark.parametrize("smallest", [1.0, 10.0, 0.01, 3.0])
def test_the_smallest_bar_stands_above_the_axis(qtbot, smallest):
    """A block whose largest value is a power of ten (a time embedding's 1.0) is a bar, not a
    line on the axis."""
    blocks = [BlockPeak("time_proj", smallest), *UNET[:3]]
    chart = _chart(qtbot, blocks, 760)
    plot = chart._plot_rect()
    low, high = chart._range()
    assert plot.bottom() - chart._y(smallest, plot, low, high) >= plot.height() * 0.25 / (
        high - low
    )
