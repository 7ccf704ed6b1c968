#!/usr/bin/env python3
"""CDK entry point: `npx cdk synth -c env=prod -c falcon.instance_type=ml.g5.24xlarge`."""

from __future__ import annotations

import sys

from settings import SettingsError
from stacks.environment import build_app, new_app
from stacks.nag import add_checks


def main() -> int:
    app = new_app()
    try:
        build_app(app)
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    add_checks(app)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
