"""Deprecated name of `gpupool.server.fleet.cloud_node`, kept for one release: sites files
that run `python -m gpupool.service.cloud_node` keep working, with a warning."""

from __future__ import annotations

import sys

MOVED_TO = "gpupool.server.fleet.cloud_node"


def main(argv: list[str] | None = None) -> int:
    print(
        f"gpupool: `python -m gpupool.service.cloud_node` is deprecated and goes away in the "
        f"next release; use `python -m {MOVED_TO}` in your sites file",
        file=sys.stderr,
    )
    from gpupool.server.fleet import cloud_node

    return cloud_node.main(argv)


if __name__ == "__main__":
    sys.exit(main())
