"""Catalogue: images as web crawls deliver them, through decoding and `vlkit extract-features`."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from vlkit.features.detector import extract_features
from vlkit.features.store import FeatureStore, skipped_path
from vlkit.validate import DataError, decode_image, rgb_array


def _extract(tmp_path, detector, files: dict[str, object], **kw):
    """Write ``files`` (name -> PIL image or bytes) into a folder and extract them; returns the store path."""
    from vlkit.features.commands import image_files

    folder = tmp_path / "images"
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            image, options = content if isinstance(content, tuple) else (content, {})
            image.save(folder / name, **options)
    return extract_features(image_files(folder), tmp_path / "f.h5", detector=detector, progress=False, **kw)


def _jpeg(size=(64, 48), color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "JPEG")
    return buf.getvalue()


def test_16_bit_png_is_scaled_not_clipped(tmp_path, shapes_detector):
    ramp = np.linspace(0, 65535, 64 * 64).reshape(64, 64).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode.startswith("I;16")
    arr = rgb_array(tmp_path / "deep.png")
    expected = np.round(ramp / 257.0).astype(np.uint8)
    assert np.array_equal(arr[..., 0], expected) and arr.mean() == pytest.approx(127.5, abs=0.5)  # not all 255
    out = _extract(tmp_path, shapes_detector, {"deep.png": Image.fromarray(ramp)})
    reference = shapes_detector.extract([np.repeat(expected[..., None], 3, axis=2)])[0]
    got = FeatureStore(out).load("deep", num_bb=100)
    np.testing.assert_allclose(got.features, reference["features"], atol=1e-2)


def test_tiny_image_is_refused_with_its_id(tmp_path, shapes_detector):
    with pytest.raises(DataError, match=r"image 'dot'.*1x1 px.*smaller than"):
        _extract(tmp_path, shapes_detector, {"dot.png": Image.new("RGB", (1, 1), (9, 9, 9))})


def test_exif_rotated_jpeg_is_stored_upright(tmp_path, shapes_detector):
    rng = np.random.default_rng(0)
    upright = Image.fromarray(rng.integers(0, 256, (120, 60, 3), dtype=np.uint8))  # 60 wide, 120 high
    exif = Image.Exif()
    exif[0x0112] = 6  # the camera's frame is rotated: viewers turn it 90 degrees clockwise
    sideways = upright.transpose(Image.Transpose.ROTATE_90)  # 120 wide, 60 high as stored
    out = _extract(tmp_path, shapes_detector, {"cam.png": (sideways, {"exif": exif.tobytes()})})
    got = FeatureStore(out).load("cam", num_bb=100)
    assert (got.image_h, got.image_w) == (120, 60)  # the frame viewers show
    assert np.array_equal(rgb_array(tmp_path / "images" / "cam.png"), np.asarray(upright))
    assert (got.boxes[:, 2] <= 60 + 1).all() and (got.boxes[:, 3] <= 120 + 1).all()


def test_extreme_aspect_ratio_is_refused_with_its_id(tmp_path, shapes_detector):
    with pytest.raises(DataError, match=r"image 'strip'.*10000x10 px.*aspect ratio of 1000:1"):
        _extract(tmp_path / "a", shapes_detector, {"strip.png": Image.new("RGB", (10000, 10), (0, 0, 200))})
    with pytest.raises(DataError, match=r"image 'wide'.*aspect ratio of 25:1"):
        _extract(tmp_path / "b", shapes_detector, {"wide.png": Image.new("RGB", (1000, 40), (0, 0, 200))})


@pytest.mark.parametrize("name,content,reason", [
    ("cut.jpg", _jpeg()[:300], "cannot decode"),
    ("empty.jpg", b"", "empty"),
    ("notes.jpg", b"these are notes, not pixels\n" * 20, "not an image"),
])
def test_corrupt_truncated_empty_and_non_image_files(tmp_path, shapes_detector, name, content, reason):
    stem = name.split(".")[0]
    with pytest.raises(DataError, match=rf"image '{stem}' \(.*{name}\).*{reason}"):
        _extract(tmp_path, shapes_detector, {name: content})
    assert not (tmp_path / "f.h5").exists()


@pytest.mark.parametrize("mode,color,expected", [
    ("L", 128, (128, 128, 128)),  # grayscale
    ("CMYK", (0, 255, 255, 0), (255, 0, 0)),  # CMYK red
    ("RGBA", (255, 0, 0, 0), (255, 255, 255)),  # fully transparent: the white background shows
    ("LA", (0, 128), (127, 127, 127)),  # half-transparent black on white
])
def test_grayscale_cmyk_and_alpha_images_become_rgb(tmp_path, mode, color, expected):
    suffix = "jpg" if mode == "CMYK" else "png"
    Image.new(mode, (8, 6), color).save(tmp_path / f"x.{suffix}")
    arr = rgb_array(tmp_path / f"x.{suffix}")
    assert arr.shape == (6, 8, 3) and arr.dtype == np.uint8
    assert np.abs(arr[0, 0].astype(int) - expected).max() <= 2


def test_palette_image_with_transparency(tmp_path):
    image = Image.new("P", (8, 6), 1)
    image.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    image.putpixel((0, 0), 0)
    image.save(tmp_path / "p.png", transparency=0)
    arr = rgb_array(tmp_path / "p.png")
    assert arr[0, 0].tolist() == [255, 255, 255] and arr[1, 1].tolist() == [255, 0, 0]


def test_skip_policy_records_every_bad_image_and_keeps_the_good(tmp_path, shapes_detector):
    good = Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    files = {"good.png": good, "cut.jpg": _jpeg()[:200], "empty.jpg": b"", "dot.png": Image.new("RGB", (1, 1)),
             "strip.png": Image.new("RGB", (2000, 20))}
    out = _extract(tmp_path, shapes_detector, files, on_error="skip")
    assert FeatureStore(out).ids() == ["good"]
    records = [json.loads(line) for line in skipped_path(out).read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ["cut", "dot", "empty", "strip"]
    assert all(r["kind"] == "image" and r["id"] in r["reason"] for r in records)
    _extract(tmp_path, shapes_detector, files, on_error="skip")  # a rerun logs nothing twice
    assert len(skipped_path(out).read_text().splitlines()) == 4


def test_image_folder_source_decodes_upright_and_names_bad_files(tmp_path):
    from vlkit.data.images import FolderImages

    exif = Image.Exif()
    exif[0x0112] = 8
    Image.new("RGB", (30, 20), (0, 90, 0)).save(tmp_path / "a.jpg", exif=exif.tobytes())
    (tmp_path / "b.jpg").write_bytes(b"\xff\xd8\xff broken")
    folder = FolderImages(tmp_path)
    assert folder("a").size == (20, 30) and folder("a").mode == "RGB"
    with pytest.raises(DataError, match=r"image 'b' \(.*b\.jpg\)"):
        folder("b")
    with pytest.raises(KeyError, match="'c' is not in"):
        folder("c")


def test_decode_refuses_an_empty_buffer_and_bad_arrays():
    with pytest.raises(DataError, match="image 'x': no bytes"):
        decode_image(b"", "x")
    with pytest.raises(DataError, match="image 'y': expected an HxWx3"):
        rgb_array(np.zeros((4, 4)), "y")
    with pytest.raises(DataError, match="image 'z': the pixel array holds NaN"):
        rgb_array(np.full((4, 4, 3), np.nan, np.float32), "z")
