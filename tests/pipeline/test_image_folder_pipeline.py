"""A user's folder of images and a user's model, through the whole local pipeline, then served.

The folder is made here: three classes of PNG and JPEG photos of different sizes (each class a
colour, with noise, so a small model can learn it), one corrupt file among them. The model is
the example package's builder (docs/examples/user-model), imported through `--model-path`.
The run prepares, trains under mixed_float16, gates, exports, converts and deploys; then
`ampflow serve` serves the deployed version (in this process, as typed: a server process only
paid another TensorFlow start-up), and `ampflow predict some.jpg` answers over gRPC and REST
through the encoded-image signature, equal to the `images` answer on the same decoded pixels.
"""

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from ports import free_port

# a hang guard, not a speed bound: the run took 473-551 s here at load 19-20 (78 s quiet)
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "user-model"
COLOURS = {"red": (200, 40, 40), "green": (40, 190, 60), "blue": (40, 60, 210)}
SIZE = 16


def _photo(rng, colour, height: int, width: int) -> np.ndarray:
    noise = rng.normal(0, 25, (height, width, 3))
    return np.clip(np.array(colour) + noise, 0, 255).astype(np.uint8)


def _write(image: np.ndarray, path: Path) -> Path:
    from PIL import Image

    Image.fromarray(image).save(path)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """train/ and test/ of three colour classes. The test split holds 10 images a class: on
    the 10 % a flat folder would hold out (2 a class), the release gate's chance test passes
    only a model that gets all 6 right, which one epoch need not (power 0.09)."""
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("photos")
    for split, count in (("train", 24), ("test", 10)):
        for name, colour in COLOURS.items():
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                height, width = rng.integers(12, 60, size=2)
                suffix = ".png" if i % 2 else ".jpg"
                _write(_photo(rng, colour, int(height), int(width)),
                       root / split / name / f"{i}{suffix}")
    (root / "train" / "red" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return root


def _free_ports() -> tuple[int, int]:
    """Two loopback ports for servers, each handed out once (tests/ports.py says why)."""
    return free_port(), free_port()


def test_image_folder_and_user_model_run_the_whole_pipeline_and_serve_encoded_images(
        tmp_path, folder):
    from cli_walk import serve_while

    from ampflow.cli import main
    from ampflow.data.images import decode_to_model_input
    from ampflow.pipeline.run_local import LocalRunConfig, run_local
    from ampflow.serving.client import PredictionClient
    from ampflow.serving.model_format import IMAGE_BYTES_SIGNATURE

    config = LocalRunConfig(
        workdir=tmp_path / "run", image_folder=str(folder), image_size=str(SIZE),
        model="example_models.net:build", model_path=str(EXAMPLE), epochs=1,
        with_float32_baseline=False, tflite_variants="float32")
    result = run_local(config, console=io.StringIO())

    info = json.loads((result.artifacts["prepare-data"]["data"] / "dataset_info.json")
                      .read_text())
    assert info["class_names"] == sorted(COLOURS)
    assert info["image_shape"] == [SIZE, SIZE, 3]
    assert info["skipped_files"]["count"] == 1  # the corrupt one: counted, listed, not fatal
    assert "broken.jpg" in json.dumps(info["skipped_files"]["files"])
    metadata = json.loads((result.artifacts["train"]["model"] / "metadata.json").read_text())
    assert metadata["model"]["kind"] == "builder"
    assert metadata["precision"]["policy"] == "mixed_float16"
    assert "deploy-serving" in result.artifacts  # the gate passed: run_local raises otherwise
    verdict = json.loads((result.artifacts["evaluate-parity"]["verdict"] / "verdict.json")
                         .read_text())
    assert verdict["notes"] == []  # 30 test images: enough to tell the model from chance
    assert verdict["checks"][0]["name"] == "chance_binomial_p_value"

    photo = next((folder / "test" / "green").glob("*.jpg"))
    port, rest_port = _free_ports()
    photo_args = ["--wait-s", "60", "--top-k", "1", str(photo)]

    def ask() -> dict:
        with PredictionClient(f"127.0.0.1:{port}") as client:
            client.wait_until_available("ampflow", timeout=120)
            encoded = photo.read_bytes()
            by_bytes = client.predict("ampflow", [encoded], signature=IMAGE_BYTES_SIGNATURE)
            pixels = decode_to_model_input(encoded, (SIZE, SIZE, 3)).numpy()[np.newaxis]
            by_pixels = client.predict("ampflow", pixels)
        # the command as a user types it, over gRPC and REST, through the CLI's main (its
        # return is the console script's exit status); once the server answers, serve's
        # capture of stdout is in place and each predict's own nests inside it
        asked = {"by_bytes": by_bytes, "by_pixels": by_pixels}
        for protocol, flags in (("grpc", ["--port", str(port)]),
                                ("rest", ["--rest", "--port", str(rest_port)])):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = main(["predict", *flags, *photo_args])
            asked[protocol] = code, out.getvalue().splitlines()
        return asked

    # `ampflow serve` in this process as typed (a server process only paid another
    # TensorFlow start-up), the client beside it
    serve, asked = serve_while(["serve", "--model-base-path", config.serving_base, "--port",
                                port, "--rest-api-port", rest_port], ask)
    serve.assert_ok()
    assert asked is not None, serve.out[-3000:]
    by_bytes, by_pixels = asked["by_bytes"], asked["by_pixels"]
    np.testing.assert_allclose(by_bytes.outputs["probabilities"],
                               by_pixels.outputs["probabilities"], rtol=1e-6, atol=1e-6)
    assert by_bytes.outputs["class_ids"].tolist() == by_pixels.outputs["class_ids"].tolist()
    answers = {}
    for protocol in ("grpc", "rest"):
        code, out = asked[protocol]
        assert code == 0, (protocol, out, serve.out[-3000:])
        # the server's own lines may land in the same capture: the answer's lines by shape
        assert [x for x in out if x.startswith("model ")] == [
            "model ampflow version 1 signature image_bytes"], (protocol, out)
        (answers[protocol],) = [x for x in out if x.startswith(f"{photo}: ")]
    assert answers["grpc"] == answers["rest"]  # the same answer over both APIs
    top = int(by_bytes.outputs["class_ids"][0])
    assert f"{info['class_names'][top]}" in answers["grpc"]
