"""DataFrames as data (`e2b/data` → `Result.data`), images (`display()` of a PIL image, and
`Image.save()` also displaying it), through the official SDK."""

from __future__ import annotations

from _interp import parse_iso, png_pixels, png_size


def test_dataframe_data_html_text(shared):
    r = shared.run_code(
        "import pandas as pd\n"
        "df = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z'], 'c': [0.5, 1.0, 2.25]})\n"
        "df"
    )
    assert r.error is None, r.error
    (res,) = r.results
    assert res.is_main_result
    assert res.data == {"a": [1, 2, 3], "b": ["x", "y", "z"], "c": [0.5, 1.0, 2.25]}, res.data
    assert "<table" in res.html and "<td>x</td>" in res.html
    assert res.text.split("\n")[0].split() == ["a", "b", "c"]
    assert "data" in res.formats() and "html" in res.formats()


def test_dataframe_timestamps_are_iso(shared):
    r = shared.run_code(
        "import pandas as pd\n"
        "pd.DataFrame({'t': pd.to_datetime(['2024-01-01 00:00', '2024-03-05 12:30']), 'v': [1, 2]})"
    )
    assert r.error is None, r.error
    data = r.results[0].data
    assert sorted(data) == ["t", "v"]
    assert data["v"] == [1, 2]
    assert [parse_iso(t) for t in data["t"]] == [parse_iso("2024-01-01T00:00:00"), parse_iso("2024-03-05T12:30:00")]


def test_dataframe_display_is_not_main(shared):
    r = shared.run_code("import pandas as pd\ndisplay(pd.DataFrame({'k': [7]}))\n'end'")
    assert [x.is_main_result for x in r.results] == [False, True]
    assert r.results[0].data == {"k": [7]}
    assert r.text == "end"


def test_display_pil_image_png(shared):
    r = shared.run_code(
        "from PIL import Image\n"
        "img = Image.new('RGB', (4, 3), (255, 0, 0))\n"
        "img.putpixel((1, 2), (0, 128, 255))\n"
        "display(img)"
    )
    assert r.error is None, r.error
    pngs = [x for x in r.results if x.png]
    assert len(pngs) == 1, [x.formats() for x in r.results]
    w, h, rows = png_pixels(pngs[0].png)
    assert (w, h) == (4, 3)
    assert rows[0][0][:3] == (255, 0, 0)
    assert rows[2][1][:3] == (0, 128, 255)
    assert rows[2][3][:3] == (255, 0, 0)


def test_pil_image_save_also_displays(shared):
    r = shared.run_code(
        "from PIL import Image\n"
        "Image.new('RGB', (5, 2), (0, 255, 0)).save('/tmp/bulkhead-green.png')\n"
        "import os; os.path.getsize('/tmp/bulkhead-green.png') > 0"
    )
    assert r.error is None, r.error
    pngs = [x for x in r.results if x.png]
    assert len(pngs) == 1, [x.formats() for x in r.results]
    assert png_size(pngs[0].png) == (5, 2)
    assert r.text == "True"
    # The file really was written too.
    assert shared.files.read("/tmp/bulkhead-green.png", format="bytes")[:8] == b"\x89PNG\r\n\x1a\n"


def test_numpy_values(shared):
    r = shared.run_code("import numpy as np\nnp.arange(6).reshape(2, 3)")
    assert r.error is None
    assert r.text == "array([[0, 1, 2],\n       [3, 4, 5]])"
