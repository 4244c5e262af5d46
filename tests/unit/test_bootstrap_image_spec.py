"""sky.Image and sky.PipIndex refuse bad input with a message that says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.api.errors import ConfigError


@pytest.mark.parametrize(("fields", "message"), [
    ({"apt": ["Bad Name"]}, "is not a Debian package name"),
    ({"env": {"1X": "v"}}, "is not an environment variable name"),
    ({"shell_vars": {"HOST-NAME": "hostname"}}, "is not an environment variable name"),
    ({"shell_vars": {"HOST": "  "}}, "HOST: empty shell command"),
    ({"skyward_source": "github"}, "no public Git repository"),
    ({"skyward_source": "conda"}, "'auto', 'local', 'pypi' or 'github'"),
    ({"includes": ["/no/such/dir"]}, "does not exist"),
    ({"metrics": ["cpu"]}, "sky.metrics objects"),
    ({"bootstrap_timeout": 0}, "greater than 0"),
    ({"pip_indexes": [sky.PipIndex(url="https://a/simple", packages=["torch"]),
                      sky.PipIndex(url="https://b/simple", packages=["Torch"])]},
     "routed to both https://a/simple and https://b/simple"),
])
def test_bad_image_fields_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        sky.Image(**fields)


def test_bad_pip_indexes_are_refused() -> None:
    with pytest.raises(ConfigError, match="http\\(s\\):// or file:// URL"):
        sky.PipIndex(url="download.pytorch.org/whl", packages=["torch"])
    with pytest.raises(ConfigError, match="at least 1 item"):
        sky.PipIndex(url="https://x/simple", packages=[])
    with pytest.raises(ConfigError, match="versions go in Image.pip"):
        sky.PipIndex(url="https://x/simple", packages=["torch==2.5"])


def test_good_images_keep_what_was_asked(tmp_path: Path) -> None:
    (tmp_path / "helpers.py").write_text("")
    image = sky.Image(apt=["git", "libgl1:amd64", "git=1:2.39.5-0+deb12u1"],
                      env={"HF_HOME": "/data/hf"}, shell_vars={"HOST": "hostname"},
                      includes=[str(tmp_path / "helpers.py")], excludes=["*.ckpt"],
                      skyward_source="pypi", metrics=sky.metrics.CPU())
    assert image.metrics == (sky.metrics.CPU(),)
    assert sky.Image().metrics == sky.metrics.Default()
    assert sky.Image(metrics=None).metrics is None
    assert sky.Image().skyward_source == "auto"
