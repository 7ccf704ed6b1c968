#!/usr/bin/env python3
"""CDK entry point: `npx cdk synth -c env=prod -c falcon.instance_type=ml.g5.24xlarge`."""

from __future__ import annotations

import sys

from stacks.environment import build_environment, new_app
from stacks.nag import add_checks
from stacks.settings import SettingsError, settings_from_context


def main() -> int:
    app = new_app()
    try:
        settings = settings_from_context(app.node.get_all_context())
        # Stacks check what only they can (GPU memory, instance families) and raise SettingsError too.
        build_environment(app, settings)
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    add_checks(app)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
