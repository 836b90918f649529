"""Where a command may write: one rule for `harness run --out` and `harness trial --out`.

Checked before anything is written, so a bad output is one line and an untouched disk:

- A URI (`scheme://...`, `remote_tree.is_uri`) is a bucket, never a local path: a `Path` would
  turn `s3://KEY:SECRET@bucket/p` into a directory `s3:` holding the credentials, and hand them
  to every component in its argv. `harness run` syncs its working copies to the bucket (the URI
  travels in the environment, `trial_storage.Storage.env`); a command that writes one local
  directory (`harness trial`, a component) refuses it. Either way a message shows the URI
  without credentials or query (`remote_tree.redact`).
- A path must be a directory or not exist yet, and the nearest part of it that exists must be a
  directory (not a file, as in `--out results.txt/trial`).

Names that become path components (`name`, arm names) are checked with the config
(`harness.config.check_path_component`, `learner.config.arm_base`).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from harness.overrides import ConfigError


class OutputError(ConfigError):
    """An output location no command can write to; the message names the option."""


def is_uri(value: str) -> bool:
    """`scheme://...` (not a Windows drive letter, not a plain path)."""
    scheme = urlsplit(value).scheme
    return len(scheme) > 1 and "://" in value


def redact(uri: str) -> str:
    """The URI without credentials or query: safe for logs and error messages."""
    split = urlsplit(uri)
    host = split.netloc.rpartition("@")[2]  # host[:port], without user:password
    return urlunsplit((split.scheme, host, split.path, "", ""))


def check_output(out: str, *, option: str, command: str, uri_ok: bool) -> None:
    """Refuse an output `command` cannot write to (see the module docstring); `option` names
    where `out` came from (`--out`, or output_dir/name)."""
    if is_uri(out):
        if uri_ok:
            return  # opened (scheme, credentials) by harness.storage.experiment_storage
        shown = redact(out)
        raise OutputError(
            f"{option} {shown} is a URI: {command} writes a local directory; for output in a "
            f"bucket run `harness run --out {shown}`"
        )
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise OutputError(f"{option} {out} is a file, not a directory")
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"{option} {out}: {parent} is a file, not a directory")
            return
