"""`python -m inference.llm.lmi render|sizing`: the configuration and the memory report, validated as in cdk synth."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from inference.llm.lmi.render import render, to_environment, to_properties_file
from inference.llm.lmi.rules import check
from inference.llm.lmi.sizing import sizing
from inference.llm.lmi.versions import backend
from settings import SettingsError, load_settings
from settings.serving import FalconSettings

DESCRIPTION = """The Falcon recipe's LMI (DJL Serving) configuration: rendered once, checked before any deploy.

    python -m inference.llm.lmi render --env prod > serving.properties
    python -m inference.llm.lmi render --env prod --format env
    python -m inference.llm.lmi sizing --instance-type ml.g5.24xlarge --tensor-parallel-degree 4
    python -m inference.llm.lmi sizing --model-config path/to/config.json --model-id org/model --dtype bf16
    python -m inference.llm.lmi stage --model-id org/model --revision <commit> --s3-uri s3://bucket/models/x/
"""

_SETTING_FLAGS = [f.name for f in dataclasses.fields(FalconSettings) if f.name != "enabled"]


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--env", help="environment from cdk.json whose falcon settings to start from (default dev)")
    overrides = common.add_argument_group("settings", "override one falcon.* setting, validated as in cdk synth")
    for name in _SETTING_FLAGS:
        overrides.add_argument("--" + name.replace("_", "-"), dest=name, metavar="VALUE")
    parser = argparse.ArgumentParser(prog="python -m inference.llm.lmi", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    render_command = commands.add_parser("render", parents=[common], help="print the LMI configuration")
    render_command.add_argument("--format", choices=("properties", "env"), default="properties",
                                help="serving.properties (default) or the environment variables the endpoint gets")
    commands.add_parser("sizing", parents=[common], help="print GPU memory per GPU and the largest batch")
    commands.add_parser("stage", add_help=False,
                        help="copy a pinned hub revision to S3 for network-isolated serving (stage --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Exit status 0: fine; 1: the settings cannot run (one `error:` line on stderr); 2: usage."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["stage"]:
        from inference.llm.lmi.stage import main as stage_main

        return stage_main(argv[1:])
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    overrides = {f"falcon.{name}": getattr(args, name) for name in _SETTING_FLAGS if getattr(args, name) is not None}
    try:
        falcon = load_settings(args.env, overrides).falcon
        if args.command == "sizing":
            print(sizing(falcon).format_report())
        warnings = check(falcon)
        if args.command == "render":
            props = render(falcon)
            if args.format == "env":
                print("\n".join(f"{name}={value}" for name, value in to_environment(falcon, props).items()))
            else:
                print(to_properties_file(props), end="")
            chosen = backend(falcon.lmi_version, falcon.batching)
            print(f"# LMI {falcon.lmi_version}, {falcon.batching}: {chosen.summary}", file=sys.stderr)
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0
