"""Image.includes packed for the node: names kept, excludes skipped, import roots chosen."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

import pytest

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.includes import check_includes
from skyward_iac.remote.includes import build_archive, is_excluded


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pkg" / "data").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "model.ckpt").write_text("big")
    (tmp_path / "pkg" / "data" / "a.csv").write_text("1")
    (tmp_path / "pkg" / "data" / "keep.txt").write_text("1")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"")
    (tmp_path / "src" / "lib").mkdir(parents=True)
    (tmp_path / "src" / "lib" / "__init__.py").write_text("")
    (tmp_path / "tool.py").write_text("X = 1\n")
    return tmp_path


def members(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted(tar.getnames())


def test_archive_layout_excludes_and_import_roots(project: Path) -> None:
    archive = build_archive([str(project / "pkg"), str(project / "src"), str(project / "tool.py")],
                            ["*.ckpt", "data/*.csv"])
    assert members(archive.data) == [
        "pkg", "pkg/__init__.py", "pkg/data", "pkg/data/keep.txt",
        "src", "src/lib", "src/lib/__init__.py", "tool.py",
    ]
    assert archive.import_roots == (".", "src")  # src has no __init__.py: a src layout


def test_an_excluded_directory_is_skipped_whole(project: Path) -> None:
    archive = build_archive([str(project / "pkg")], ["data"])
    assert not [m for m in members(archive.data) if "data" in m]


def test_patterns_match_paths_and_names() -> None:
    assert is_excluded(PurePosixPath("a/b/c.pyc"), ["*.pyc"])
    assert is_excluded(PurePosixPath("data/x.csv"), ["data/*"])
    assert not is_excluded(PurePosixPath("other/data.txt"), ["data/*"])
    assert is_excluded(PurePosixPath("deep/__pycache__"), [])


def test_bad_includes_fail_before_anything_runs(project: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        check_includes([str(project / "missing")], [])
    (project / "notes.txt").write_text("")
    with pytest.raises(ConfigError, match="directory or a .py file"):
        check_includes([str(project / "notes.txt")], [])
    (project / "other" / "pkg").mkdir(parents=True)
    with pytest.raises(ConfigError, match="would both land on the node as 'pkg'"):
        check_includes([str(project / "pkg"), str(project / "other" / "pkg")], [])
    with pytest.raises(ConfigError, match="empty pattern"):
        check_includes([], [" "])


def test_a_pool_packs_its_includes_once_for_every_node(project: Path) -> None:
    """Late, replaced and added nodes get the code as it was when the pool started, even if
    the files change meanwhile (and the archive is not rebuilt per node)."""
    import skyward_iac as sky
    from skyward_iac.outputs import NodeAddress

    compute = sky.Compute(provider=sky.Local(), nodes=2,
                          image=sky.Image(includes=[str(project / "tool.py")]))
    first = compute.plan.includes
    (project / "tool.py").write_text("X = 2\n")
    nodes = [NodeAddress(index=i, private_address=f"127.0.0.{i + 2}", public_address="",
                         ssh_port=22, ssh_user="u", host_key="k", workdir=f"/w/{i}")
             for i in range(2)]
    plans = [compute.plan.bootstrap_plan(
                 node, SimpleNamespace(volume_keys={}, nodes=nodes, etcd=None, certificates=None,
                                       node=lambda i: nodes[i]))
             for node in nodes]
    assert all(plan.includes is first for plan in plans)
