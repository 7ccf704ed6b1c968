#!/usr/bin/env python3
"""CDK entry point: `npx cdk synth -c env=prod -c falcon.instance_type=ml.g5.24xlarge`."""

from __future__ import annotations

import sys

from stacks.environment import build_environment, new_app
from stacks.nag import add_checks
from stacks.pipeline import PipelineStack
from stacks.settings import SettingsError, load_settings, overrides_from_context, settings_from_context


def main() -> int:
    app = new_app()
    try:
        context = app.node.get_all_context()
        settings = settings_from_context(context)
        # Stacks check what only they can (GPU memory, instance families) and raise SettingsError too.
        if settings.pipeline.enabled:
            overrides = overrides_from_context(context)
            stages = [load_settings(name, overrides) for name in settings.pipeline.stages]
            PipelineStack(app, settings=settings, stages=stages, overrides=overrides)
        else:
            build_environment(app, settings)
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    add_checks(app)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
