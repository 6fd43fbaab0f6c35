"""``megatron.energon.epathlib.rclone_config``: reading rclone's configuration file (the reference's
former way to name S3 credentials; energon reads object storage through multi-storage-client or
``s3://`` URLs, see docs/remote.md)."""

from __future__ import annotations

import configparser
import os
import shutil
from pathlib import Path

from energon.samples.edataclass import edataclass

__all__ = [
    "ConfigEntry",
    "edataclass",
    "find_executable_path",
    "get_rclone_config_path",
    "read_rclone_config",
    "read_rclone_config_at_path",
]


@edataclass
class ConfigEntry:
    name: str
    type: str
    provider: str | None
    access_key_id: str | None
    secret_access_key: str | None
    region: str | None
    endpoint: str | None


def find_executable_path(executable_name: str) -> str | None:
    """The executable's path on ``PATH``, or None."""
    return shutil.which(executable_name)


def get_rclone_config_path() -> Path | None:
    """rclone's config file: ``RCLONE_CONFIG``, else the user's default location (None if absent)."""
    candidates = []
    if os.environ.get("RCLONE_CONFIG"):
        candidates.append(Path(os.environ["RCLONE_CONFIG"]))
    xdg = os.environ.get("XDG_CONFIG_HOME", os.path.expanduser("~/.config"))
    candidates += [Path(xdg) / "rclone" / "rclone.conf", Path("~/.rclone.conf").expanduser()]
    return next((p for p in candidates if p.is_file()), None)


def read_rclone_config_at_path(config_path: Path) -> dict[str, ConfigEntry]:
    """Every remote of the config file, by name."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(config_path)
    return {
        name: ConfigEntry(
            name=name,
            type=section.get("type"),
            provider=section.get("provider"),
            access_key_id=section.get("access_key_id"),
            secret_access_key=section.get("secret_access_key"),
            region=section.get("region"),
            endpoint=section.get("endpoint"),
        )
        for name, section in parser.items()
        if name != configparser.DEFAULTSECT
    }


def read_rclone_config() -> dict[str, ConfigEntry]:
    """The remotes of rclone's config file (empty without one)."""
    path = get_rclone_config_path()
    return {} if path is None else read_rclone_config_at_path(path)
