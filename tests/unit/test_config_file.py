"""skyward.toml and defaults.toml: named pools, the merge, and every error message."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.config_file import (
    defaults_file,
    find_project_file,
    load_pool,
    pool_names,
    pool_settings,
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("SKYWARD_HOME", str(path))
    return path


@pytest.fixture
def project(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory; tests run from a sub-directory of it."""
    root = tmp_path / "project"
    (root / "src" / "deep").mkdir(parents=True)
    monkeypatch.chdir(root / "src" / "deep")
    return root


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def error_of(name: str) -> str:
    with pytest.raises(sky.ConfigError) as error:
        load_pool(name)
    return str(error.value)


def test_a_named_pool_with_every_kind_of_value(project: Path) -> None:
    write(project / "skyward.toml", """
        [pools.train]
        provider = { kind = "aws", region = "us-east-1", use_default_vpc = false }
        accelerator = "H100:8"
        nodes = [2, 8]
        vcpus = 16
        memory_gb = 64.5
        disk_gb = 200
        architecture = "x86_64"
        allocation = "spot"
        region = "us-east-1"
        max_hourly_cost = 40.0
        ttl = 120
        image = { python = "3.12", pip = ["torch", "numpy"], env = { HF_HOME = "/data/hf" } }

        [pools.small]
        provider = "gcp"
        accelerator = { name = "a100", count = 2, memory = "40GB" }
        nodes = { desired = 4, min = 2 }
    """)
    spec = load_pool("train")
    assert spec == sky.Spec(
        provider=sky.AWS(region="us-east-1", use_default_vpc=False),
        accelerator=sky.accelerators.H100(count=8), nodes=(2, 8), vcpus=16, memory_gb=64.5,
        disk_gb=200, architecture="x86_64", allocation="spot", region="us-east-1",
        max_hourly_cost=40.0, ttl=120,
        image=sky.Image(python="3.12", pip=("torch", "numpy"), env={"HF_HOME": "/data/hf"}),
    )
    small = load_pool("small")
    assert small.provider == sky.GCP() and small.nodes == sky.Nodes(desired=4, min=2)
    assert small.accelerator == sky.accelerators.A100(count=2, memory="40GB")
    assert pool_names() == ["small", "train"]


def test_the_project_file_is_found_upward_and_defaults_in_the_home(project: Path,
                                                                   home: Path) -> None:
    assert find_project_file() is None
    path = write(project / "skyward.toml", "[pools.a]\nprovider = 'local'\n")
    assert find_project_file() == path
    assert defaults_file() == home / "defaults.toml"


def test_project_keys_override_defaults_key_by_key(project: Path, home: Path) -> None:
    write(home / "defaults.toml", """
        [pools.train]
        provider = "gcp"
        ttl = 300
        image = { pip = ["numpy"], env = { A = "1" } }
        [pools.cpu]
        provider = "local"
        nodes = 3
    """)
    write(project / "skyward.toml", """
        [pools.train]
        provider = { kind = "aws", region = "eu-west-1" }
        image = { pip = ["torch"] }
    """)
    train = load_pool("train")
    assert train.provider == sky.AWS(region="eu-west-1")  # from the project
    assert train.ttl == 300                                 # from the defaults
    assert train.image == sky.Image(pip=("torch",))         # whole values, not merged
    assert load_pool("cpu").nodes == sky.Nodes(desired=3)   # only in the defaults
    settings = pool_settings("train")
    assert settings["ttl"].file == home / "defaults.toml"
    assert settings["provider"].file == project / "skyward.toml"


def test_a_pool_from_the_defaults_alone(home: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(home / "defaults.toml", "[pools.cpu]\nprovider = 'local'\n")
    assert load_pool("cpu").provider == sky.Local()


# ---- errors: each names the file, the key and what is allowed ----------------------------

def test_no_files_at_all(project: Path, home: Path) -> None:
    message = error_of("train")
    assert message.startswith("no pool named 'train': no [pools.*] found in skyward.toml (in ")
    assert str(home / "defaults.toml") in message
    assert "add a [pools.train] table to skyward.toml" in message


def test_an_unknown_pool_lists_the_defined_ones(project: Path, home: Path) -> None:
    write(project / "skyward.toml", "[pools.train]\nprovider = 'local'\n")
    write(home / "defaults.toml", "[pools.cpu]\nprovider = 'local'\n")
    message = error_of("trian")
    assert "no pool named 'trian' in skyward.toml" in message
    assert message.endswith("defined pools: cpu, train")


@pytest.mark.parametrize(("toml", "expected"), [
    ("[pools.p]\nprovider = 'local'\nnodez = 2\n",
     "pools.p.nodez: unknown key (did you mean 'nodes'?); allowed: provider, accelerator, "
     "nodes, vcpus"),
    ("[pools.p]\nprovider = 'azure'\n",
     "pools.p.provider: unknown provider 'azure'; allowed: 'local', 'aws', 'gcp'"),
    ("[pools.p]\nprovider = { region = 'x' }\n",
     "pools.p.provider: a provider table needs kind = one of 'local', 'aws', 'gcp'"),
    ("[pools.p]\nprovider = { kind = 'aws', regoin = 'x' }\n",
     "pools.p.provider.regoin: unknown option for provider 'aws' (did you mean 'region'?); "
     "allowed: container_image, region, use_default_vpc, ssh_cidr"),
    ("[pools.p]\nprovider = { kind = 'local', region = 'x' }\n",
     "pools.p.provider.region: unknown option for provider 'local'; allowed: container_image"),
    ("[pools.p]\nprovider = { kind = 'aws', use_default_vpc = 'maybe' }\n",
     "pools.p.provider: use_default_vpc: Input should be a valid boolean"),
    ("[pools.p]\nprovider = 'local'\naccelerator = 'A101'\n",
     "pools.p.accelerator: unknown accelerator 'A101' (did you mean 'A10'?); allowed: B200, "),
    ("[pools.p]\nprovider = 'local'\naccelerator = 'H100:many'\n",
     "pools.p.accelerator: 'H100:many': the count after ':' must be a number, as in 'H100:8'"),
    ("[pools.p]\nprovider = 'local'\naccelerator = { name = 'A100', memory = '48GB' }\n",
     "pools.p.accelerator: A100 comes with memory '80GB', '40GB', not '48GB'"),
    ("[pools.p]\nprovider = 'local'\naccelerator = { name = 'T4', memory = '32GB' }\n",
     "pools.p.accelerator: T4 comes with memory '16GB', not '32GB'"),
    ("[pools.p]\nprovider = 'local'\naccelerator = { name = 'T4', form_factor = 'SXM' }\n",
     "pools.p.accelerator: T4 has no form_factor option; leave it out"),
    ("[pools.p]\nprovider = 'local'\naccelerator = { name = 'A100', count = 0 }\n",
     "pools.p.accelerator: count: Input should be greater than 0"),
    ("[pools.p]\nprovider = 'local'\naccelerator = { name = 'T4', cores = 2 }\n",
     "pools.p.accelerator.cores: unknown accelerator option; allowed: name, count, memory, "
     "form_factor"),
    ("[pools.p]\nprovider = 'local'\naccelerator = { count = 2 }\n",
     "pools.p.accelerator: an accelerator table needs name = such as 'A100'"),
    ("[pools.p]\nprovider = 'local'\naccelerator = 3\n",
     "pools.p.accelerator: must be an accelerator name such as 'A100', 'H100:8' or a table"),
    ("[pools.p]\nprovider = 'local'\nallocation = 'sometimes'\n",
     "pools.p.allocation: Input should be 'spot-if-available', 'spot', 'on-demand' or "
     "'cheapest'"),
    ("[pools.p]\nprovider = 'local'\nnodes = 0\n", "pools.p.nodes: nodes must be at least 1"),
    ("[pools.p]\nprovider = 'local'\nnodes = [1, 2, 3]\n",
     "pools.p.nodes: must be a count (4), [low, high] ([2, 8]) or a table { desired = 8, "
     "min = 4, max = 16 }, got [1, 2, 3]"),
    ("[pools.p]\nprovider = 'local'\nnodes = { desired = 2, min = 3 }\n",
     "pools.p.nodes: min (3) cannot exceed desired (2)"),
    ("[pools.p]\nprovider = 'local'\nimage = { pip = 'torch' }\n",
     "pools.p.image.pip: Input should be an array"),
    ("[pools.p]\nprovider = 'local'\nimage = { python = '3' }\n",
     "pools.p.image.python: python must be 'auto' or a version like '3.11', got '3'"),
    ("[pools.p]\nnodes = 2\n",
     "pools.p.provider is missing; allowed: 'local', 'aws', 'gcp' or a table with kind = ..."),
    ("[pools.p]\nprovider = 'local'\nttl = -5\n",
     "pools.p.ttl: ttl must be >= 0 seconds (0 disables the dead-man switch), got -5"),
])
def test_value_errors_name_file_key_and_allowed_values(project: Path, toml: str,
                                                       expected: str) -> None:
    path = write(project / "skyward.toml", toml)
    message = error_of("p")
    assert message.startswith(f"{path}: "), message
    assert expected in message, message


def test_an_error_names_the_defaults_file_when_the_key_came_from_there(project: Path,
                                                                       home: Path) -> None:
    write(home / "defaults.toml", "[pools.p]\nallocation = 'sometimes'\n")
    write(project / "skyward.toml", "[pools.p]\nprovider = 'local'\n")
    assert error_of("p").startswith(f"{home / 'defaults.toml'}: pools.p.allocation: ")


def test_every_problem_of_a_pool_is_reported_at_once(project: Path) -> None:
    write(project / "skyward.toml",
          "[pools.p]\nprovider = 'local'\nallocation = 'x'\nvcpus = -1\n")
    lines = error_of("p").splitlines()
    assert [line.split(": ")[1] for line in lines] == ["pools.p.vcpus", "pools.p.allocation"]


@pytest.mark.parametrize(("toml", "expected"), [
    ("[pools.p\nprovider = 'local'\n", "not valid TOML: "),
    ("pool = 1\n", "unknown top-level key 'pool'; allowed: pools (define pools as "
                   "[pools.NAME] tables)"),
    ("pools = 3\n", "pools must be a table of [pools.NAME] tables, got 3"),
    ("[pools]\np = 'local'\n", "pools.p must be a table ([pools.p]) of Spec fields, got 'local'"),
])
def test_shape_errors_name_the_file(project: Path, toml: str, expected: str) -> None:
    path = write(project / "skyward.toml", toml)
    message = error_of("p")
    assert message.startswith(f"{path}: ") and expected in message, message


def test_an_invalid_defaults_file_is_reported_even_for_a_project_pool(project: Path,
                                                                      home: Path) -> None:
    write(project / "skyward.toml", "[pools.p]\nprovider = 'local'\n")
    write(home / "defaults.toml", "not toml at all")
    assert error_of("p").startswith(f"{home / 'defaults.toml'}: not valid TOML")


def test_a_pool_name_must_be_a_string(project: Path) -> None:
    with pytest.raises(sky.ConfigError, match="a pool name must be a non-empty string, got ''"):
        load_pool("")
