"""Files and directories between this machine and a node, over SFTP (``skyward-iac cp``).

``cp -r`` semantics both ways: a directory is copied with everything in it; a destination that
is an existing directory receives the source under its own name, any other destination path
becomes the copy. Permission bits travel with each file; a symbolic link inside a copied
directory is copied as a link (never followed, so a link to ``/`` copies nothing more).
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass
from pathlib import Path

import paramiko


@dataclass
class Copied:
    """What one copy moved."""

    files: int = 0
    bytes: int = 0
    links: int = 0


def remote_path(workdir: str, path: str) -> str:
    """A node path as given (absolute), or relative to the node's workdir (empty: the
    workdir itself)."""
    return posixpath.normpath(posixpath.join(workdir, path)) if path else workdir


def download(sftp: paramiko.SFTPClient, source: str, destination: Path) -> Copied:
    """Copy the node's ``source`` (a file or a directory) to ``destination`` here."""
    attrs = sftp.stat(source)  # follows a link given by name, as cp does
    if destination.is_dir():
        destination = destination / posixpath.basename(source.rstrip("/"))
    copied = Copied()
    _download(sftp, source, attrs, destination, copied)
    return copied


def _download(sftp: paramiko.SFTPClient, source: str, attrs: paramiko.SFTPAttributes,
              destination: Path, copied: Copied) -> None:
    mode = attrs.st_mode or 0
    if stat.S_ISDIR(mode):
        destination.mkdir(exist_ok=True)
        for entry in sftp.listdir_attr(source):  # lstat attributes: links are seen as links
            _download(sftp, posixpath.join(source, entry.filename), entry,
                      destination / entry.filename, copied)
    elif stat.S_ISLNK(mode):
        destination.unlink(missing_ok=True)
        destination.symlink_to(sftp.readlink(source) or "")
        copied.links += 1
        return
    elif stat.S_ISREG(mode):
        sftp.get(source, str(destination))
        copied.files += 1
        copied.bytes += attrs.st_size or 0
    else:
        return  # a socket, a fifo, a device: nothing to copy
    os.chmod(destination, stat.S_IMODE(mode))


def upload(sftp: paramiko.SFTPClient, source: Path, destination: str) -> Copied:
    """Copy ``source`` here (a file or a directory) to the node's ``destination``."""
    if not source.exists():
        raise FileNotFoundError(2, "No such file or directory", str(source))
    if _remote_is_dir(sftp, destination):
        destination = posixpath.join(destination, source.name)
    copied = Copied()
    _upload(sftp, source, destination, copied, top=True)
    return copied


def _upload(sftp: paramiko.SFTPClient, source: Path, destination: str, copied: Copied,
            top: bool = False) -> None:
    info = source.stat() if top else source.lstat()
    if stat.S_ISLNK(info.st_mode):
        if _exists(sftp, destination):
            sftp.remove(destination)
        sftp.symlink(os.readlink(source), destination)
        copied.links += 1
        return
    if stat.S_ISDIR(info.st_mode):
        if not _remote_is_dir(sftp, destination):
            sftp.mkdir(destination)
        for entry in sorted(source.iterdir()):
            _upload(sftp, entry, posixpath.join(destination, entry.name), copied)
    elif stat.S_ISREG(info.st_mode):
        sftp.put(str(source), destination)
        copied.files += 1
        copied.bytes += info.st_size
    else:
        return
    sftp.chmod(destination, stat.S_IMODE(info.st_mode))


def _remote_is_dir(sftp: paramiko.SFTPClient, path: str) -> bool:
    try:
        return stat.S_ISDIR(sftp.stat(path).st_mode or 0)
    except FileNotFoundError:
        return False


def _exists(sftp: paramiko.SFTPClient, path: str) -> bool:
    try:
        sftp.lstat(path)
        return True
    except FileNotFoundError:
        return False
