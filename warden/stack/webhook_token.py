"""The bearer token Alertmanager sends to the engine webhook, as a file only they can read.

Both sides read the same file: Alertmanager through ``credentials_file`` (re-read on every
request, so rotation needs no reload) and the engine through ``WARDEN_WEBHOOK_TOKEN_FILE``.
The token never appears on a command line or in a rendered config. (Compose makes its own
on first start: ``warden.stack.compose_init``.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from warden.common.tokens import TOKEN_FILE_ENV, read_token_file, write_token

__all__ = ["TOKEN_FILE_ENV", "read_token", "write_token"]
read_token = read_token_file


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m warden.stack.webhook_token", description="write a webhook token file"
    )
    parser.add_argument("path", help="where to write it (mode 0600)")
    parser.add_argument("--force", action="store_true", help="replace an existing token")
    args = parser.parse_args(argv)
    path = Path(args.path)
    if path.exists() and not args.force:
        print(f"{path} exists; keeping it (--force replaces it)")
        return 0
    write_token(path)
    print(f"wrote a new webhook token to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
