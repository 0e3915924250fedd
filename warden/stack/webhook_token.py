"""The bearer token Alertmanager sends to the engine webhook, as a file only they can read.

Both sides read the same file: Alertmanager through ``credentials_file`` (re-read on every
request, so rotation needs no reload) and the engine through ``WARDEN_WEBHOOK_TOKEN_FILE``.
The token never appears on a command line or in a rendered config.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from warden.common.tokens import TOKEN_FILE_ENV, read_token_file, write_token

__all__ = ["TOKEN_FILE_ENV", "read_token", "write_compose_token", "write_token"]
read_token = read_token_file


def write_compose_token(path: Path) -> Path:
    """For compose: outside swarm, a file secret is bind-mounted as it is, and Alertmanager and
    the engine run as other users than yours, so the file is 0644 inside a 0700 folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    return write_token(path, 0o644)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m warden.stack.webhook_token", description="write a webhook token file"
    )
    parser.add_argument("path", nargs="?", default="compose/secrets/webhook-token")
    parser.add_argument("--compose", action="store_true", help="modes for a compose file secret")
    parser.add_argument("--force", action="store_true", help="replace an existing token")
    args = parser.parse_args(argv)
    path = Path(args.path)
    if path.exists() and not args.force:
        print(f"{path} exists; keeping it (--force replaces it)")
        return 0
    (write_compose_token if args.compose else write_token)(path)
    print(f"wrote a new webhook token to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
