"""plots: numbers in the confusion chart, speedup table and figure; light import."""
import os
import pathlib
import subprocess
import sys

import matplotlib
import matplotlib.image
import numpy as np
import pytest

from jaxflowers import plots

NAMES = ["daisy", "dandelion", "roses", "sunflowers"]
TRUE = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
PRED = np.array([0, 0, 1, 1, 2, 2, 2, 2, 0, 3])
COUNTS = [[2, 1, 0, 0], [0, 1, 1, 0], [1, 0, 3, 0], [0, 0, 0, 1]]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def cell_texts(ax):
    """{(row, column): text} of the labels drawn on an Axes."""
    return {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text()
            for t in ax.texts}


def assert_png(path, fig, dpi):
    image = matplotlib.image.imread(path)
    width, height = fig.get_size_inches() * dpi
    assert image.shape[:2] == (round(height), round(width))
    assert image[..., :3].std() > 0.01  # something was drawn, not a blank canvas


def test_confusion_chart_counts_and_summaries(tmp_path):
    chart = plots.confusion_chart(TRUE, PRED, NAMES, title="Flowers")
    assert chart.matrix.tolist() == COUNTS and chart.matrix.dtype == np.int64
    main, rows, cols = chart.figure.axes
    assert cell_texts(main) == {(0, 0): "2", (0, 1): "1", (1, 1): "1", (1, 2): "1",
                                (2, 0): "1", (2, 2): "3", (3, 3): "1"}  # zeros stay blank
    np.testing.assert_allclose(chart.row_summary, [[200 / 3, 100 / 3], [50, 50], [75, 25],
                                                   [100, 0]])
    assert cell_texts(rows) == {(0, 0): "66.7%", (0, 1): "33.3%", (1, 0): "50.0%",
                                (1, 1): "50.0%", (2, 0): "75.0%", (2, 1): "25.0%",
                                (3, 0): "100.0%", (3, 1): "0.0%"}
    np.testing.assert_allclose(chart.column_summary, [[200 / 3, 50, 75, 100],
                                                      [100 / 3, 50, 25, 0]])
    assert cell_texts(cols)[(0, 2)] == "75.0%" and cell_texts(cols)[(1, 0)] == "33.3%"
    assert main.get_title() == "Flowers"
    assert [t.get_text() for t in main.get_yticklabels()] == NAMES
    chart.figure.savefig(tmp_path / "cc.png", dpi=50)
    assert_png(tmp_path / "cc.png", chart.figure, 50)


def test_confusion_chart_explains_itself_and_saves_what_it_shows(tmp_path):
    chart = plots.confusion_chart(TRUE, PRED, NAMES)
    main, rows, cols = chart.figure.axes
    assert main.get_title() == "10 samples, 70.0% correct"  # a title by default
    assert rows.get_title() == "Per true class" and cols.get_title() == "Per predicted class"
    assert [t.get_text() for t in rows.get_xticklabels()] == ["Correct", "Incorrect"]
    assert [t.get_text() for t in cols.get_yticklabels()] == ["Correct", "Incorrect"]
    assert [t.get_text() for t in main.get_yticklabels()] == NAMES  # the strips keep them
    assert chart.savefig(tmp_path / "chart.png", dpi=60) == tmp_path / "chart.png"
    saved = matplotlib.image.imread(tmp_path / "chart.png")
    chart.figure.set_dpi(60)
    chart.figure.canvas.draw()
    shown = np.asarray(chart.figure.canvas.buffer_rgba(), dtype=np.float32) / 255
    np.testing.assert_allclose(saved, shown, atol=1 / 255)  # the file is what was drawn
    chart.savefig(tmp_path / "chart.pdf")
    assert (tmp_path / "chart.pdf").read_bytes()[:4] == b"%PDF"
    assert plots.confusion_chart(TRUE, PRED, NAMES, title="").ax.get_title() == ""
    with pytest.raises(FileNotFoundError):
        chart.savefig(tmp_path / "missing" / "chart.png")
    # savefig lays the chart out once itself; the figure keeps its layout engine after it,
    # also when writing failed
    assert type(chart.figure.get_layout_engine()).__name__ == "TightLayoutEngine"


def test_confusion_chart_string_labels_options_and_errors():
    names = np.array(NAMES)
    chart = plots.confusion_chart(names[TRUE], list(names[PRED]), NAMES, row_summary=None,
                                  column_summary="off", normalization="row-normalized")
    assert chart.matrix.tolist() == COUNTS
    assert chart.row_summary is None and chart.column_summary is None
    assert len(chart.figure.axes) == 1
    assert cell_texts(chart.ax)[(2, 2)] == "75.0%" and cell_texts(chart.ax)[(0, 1)] == "33.3%"
    absolute = plots.confusion_chart(TRUE, PRED, NAMES + ["tulips"], row_summary="absolute",
                                     column_summary=None)
    assert absolute.row_summary.tolist() == [[2, 1], [1, 1], [3, 1], [1, 0], [0, 0]]
    assert cell_texts(absolute.figure.axes[1])[(2, 1)] == "1"
    with pytest.raises(ValueError, match="'tulips'"):
        plots.confusion_chart(["tulips"], ["daisy"], NAMES)
    with pytest.raises(ValueError, match="contains 4"):
        plots.confusion_chart([4], [0], NAMES)
    with pytest.raises(ValueError, match="row_summary='precision'"):
        plots.confusion_chart(TRUE, PRED, NAMES, row_summary="precision")


BENCH = {"device_kind": "NVIDIA H200", "results": [
    {"model": "resnet50", "strategy": "shard_map", "scaling": "weak", "devices": 1,
     "images_per_s": 100.0},
    *({"model": "resnet50", "strategy": "shard_map", "scaling": "weak", "devices": 2,
       "images_per_s": v} for v in (190.0, 210.0, 200.0)),  # repeats: the median counts
    {"model": "resnet50", "strategy": "shard_map", "scaling": "weak", "devices": 4,
     "images_per_s": 360.0},
    *({"model": "cifar_net", "strategy": "pmap", "scaling": "strong", "devices": n,
       "images_per_s": v} for n, v in ((8, 600.0), (2, 300.0), (4, 450.0))),
]}


def test_speedup_table_numbers():
    rows = plots.speedup_table(BENCH)
    assert rows == [
        # no 1-device run: speedup counted from 2 devices, as 2 * ips_N / ips_2
        dict(model="cifar_net", strategy="pmap", scaling="strong", devices=2,
             images_per_s=300.0, speedup=2.0, efficiency=1.0),
        dict(model="cifar_net", strategy="pmap", scaling="strong", devices=4,
             images_per_s=450.0, speedup=3.0, efficiency=0.75),
        dict(model="cifar_net", strategy="pmap", scaling="strong", devices=8,
             images_per_s=600.0, speedup=4.0, efficiency=0.5),
        dict(model="resnet50", strategy="shard_map", scaling="weak", devices=1,
             images_per_s=100.0, speedup=1.0, efficiency=1.0),
        dict(model="resnet50", strategy="shard_map", scaling="weak", devices=2,
             images_per_s=200.0, speedup=2.0, efficiency=1.0),
        dict(model="resnet50", strategy="shard_map", scaling="weak", devices=4,
             images_per_s=360.0, speedup=3.6, efficiency=0.9),
    ]
    assert plots.speedup_table(BENCH["results"]) == rows
    with pytest.raises(ValueError, match="lacks \\['scaling'\\]"):
        plots.speedup_table([{"model": "m", "strategy": "s", "devices": 1,
                              "images_per_s": 1.0}])


def test_speedup_figure_has_throughput_and_speedup_panels(tmp_path):
    fig = plots.speedup(dict(BENCH, environment={"devices": "8 x NVIDIA H200"}),
                        path=tmp_path / "speedup.png")
    assert_png(tmp_path / "speedup.png", fig, 120)
    ips, gain = fig.axes
    assert (ips.get_title(), gain.get_title()) == ("Throughput", "Speedup")
    assert fig._suptitle.get_text() == "8 x NVIDIA H200"
    systems = ["resnet50, shard_map (weak)", "cifar_net, pmap (strong)"]
    ips_lines = {line.get_label(): line for line in ips.lines}
    assert sorted(ips_lines) == sorted(systems)
    np.testing.assert_array_equal(ips_lines[systems[0]].get_ydata(), [100, 200, 360])
    assert "2" in [t.get_text() for t in ips.get_xticklabels()] and ips.get_ylim()[0] == 0
    assert {t.get_text() for t in ips.texts} >= {"100", "200", "360", "300", "450", "600"}
    gain_lines = {line.get_label(): line for line in gain.lines}
    assert sorted(gain_lines) == sorted(systems + ["ideal"])
    np.testing.assert_array_equal(gain_lines[systems[0]].get_ydata(), [1, 2, 3.6])
    np.testing.assert_array_equal(gain_lines[systems[1]].get_xdata(), [2, 4, 8])
    np.testing.assert_array_equal(gain_lines["ideal"].get_xydata(), [[1, 1], [8, 8]])
    assert list(gain.get_xticks()) == [1, 2, 4, 8]
    assert all(float(t).is_integer() for t in gain.get_yticks())
    for ax in (ips, gain):
        assert ax.get_legend() is not None


def test_speedup_figure_with_one_device_shows_throughput_and_each_window():
    """One device count has no speedup: the second panel shows how steady each timed window
    was (ms per iteration), and each window's images/s sits on its system's bar."""
    one = [{"model": "cifar_net:1", "strategy": s, "scaling": "weak", "devices": 1,
            "images_per_s": v, "windows_s": w, "window_steps": 2, "global_batch": 8,
            "compile_s": 3.25}
           for s, v, w in (("shard_map", 812.4, [0.02, 0.025]), ("pmap", 790.0, [0.02] * 3))]
    ips, windows = plots.speedup(one).axes
    assert [bar.get_width() for bar in ips.patches] == [790.0, 812.4]  # one bar per system
    assert [t.get_text() for t in ips.get_yticklabels()] == ["cifar_net:1, pmap (weak)",
                                                           "cifar_net:1, shard_map (weak)"]
    assert [t.get_text() for t in ips.texts] == ["790", "812"]
    assert ips.get_xlabel() == "Images/s on 1 device (bar: median window)"
    dots = [line.get_xdata().tolist() for line in ips.lines]
    assert dots == [[800.0] * 3, [800.0, 640.0]]  # 2 iterations x 8 images per window
    assert windows.get_title() == "Time per iteration, window by window"
    assert [line.get_ydata().tolist() for line in windows.lines] == [[10.0] * 3, [10.0, 12.5]]
    assert [t.get_text() for t in windows.get_legend().get_texts()] == [
        "cifar_net:1, pmap (weak), compile 3.2 s", "cifar_net:1, shard_map (weak), compile 3.2 s"]
    assert "no speedup" in windows.texts[0].get_text()


@pytest.mark.parametrize("classes, most_inches", [(3, 7), (10, 9.5), (30, 14.5)])
def test_confusion_chart_grows_with_its_classes_and_keeps_text_readable(classes, most_inches):
    names = [f"c{i}" for i in range(classes)]
    chart = plots.confusion_chart(np.arange(classes), np.arange(classes), names)
    width, height = chart.figure.get_size_inches()
    assert max(width, height) <= most_inches
    font = chart.ax.texts[0].get_fontsize()
    assert font >= 6 and font == chart.figure.axes[1].texts[0].get_fontsize()
    chart.figure.canvas.draw()  # the strip under the cells starts just below their labels
    cells, strip = chart.ax.get_window_extent(), chart.figure.axes[2].get_window_extent()
    labels = chart.ax.xaxis.label.get_window_extent()
    gap = (labels.y0 - strip.y1) / chart.figure.dpi
    assert 0 < gap < 0.45 and cells.y0 > labels.y1
    # Each cell's number (the widest, "100.0%", in the summaries) fits its cell: the layout
    # leaves the numbers out, so none may stick out of the cells' axes.
    renderer = chart.figure.canvas.get_renderer()
    for ax in chart.figure.axes:
        box = ax.get_window_extent()
        rows, columns = np.shape(ax.images[0].get_array())[:2]
        for text in ax.texts:
            extent = text.get_window_extent(renderer)
            assert extent.width <= box.width / columns and extent.height <= box.height / rows
            assert box.x0 <= extent.x0 and extent.x1 <= box.x1, text
            assert box.y0 <= extent.y0 and extent.y1 <= box.y1, text


def test_import_is_light_and_charts_never_open_windows():
    """Importing the package loads no pyplot, NVML or IPython; drawing where DISPLAY names
    no display that answers picks Agg (matplotlib's own check), so nothing waits on a window."""
    code = ("import sys, jaxflowers, jaxflowers.plots, jaxflowers.monitor\n"
            "heavy = [m for m in ('matplotlib.pyplot', 'pynvml', 'IPython') if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "jaxflowers.plots.confusion_chart([0, 1], [1, 1], ['a', 'b'])\n"
            "import matplotlib\n"
            "print(matplotlib.get_backend().lower())\n")
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env.update(DISPLAY=":99", PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "agg"


def test_a_class_named_by_undecodable_bytes_is_drawn_not_lost(tmp_path):
    """A folder name that is not UTF-8 becomes a str with surrogate escapes, which no font
    draws: the chart shows its bytes instead of failing (the sweep's chart was lost)."""
    import os

    name = os.fsdecode(b"caf\xe9")
    chart = plots.confusion_chart([0, 1, 1], [0, 1, 0], [name, "b"], title=f"of {name}")
    chart.savefig(tmp_path / "chart.png")
    assert chart.class_names == [name, "b"]
    assert [t.get_text() for t in chart.ax.get_yticklabels()] == ["caf\\xe9", "b"]
