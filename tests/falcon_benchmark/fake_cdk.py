"""Stands in for `npx cdk` in the benchmark's tests: logs each call, writes an outputs file, fails on demand.

FAKE_CDK_LOG: a file that gets one JSON line per call ({"verb", "context", "stack"}).
FAKE_CDK_FAIL: comma-separated `verb:what` where `what` is a falcon.batching mode or a stack name.
"""

import json
import os
import sys


def main(argv: list[str]) -> int:
    verb, rest = argv[0], argv[1:]
    context, stack, outputs = {}, None, None
    index = 0
    while index < len(rest):
        arg = rest[index]
        if arg == "-c":
            key, _, value = rest[index + 1].partition("=")
            context[key] = value
            index += 2
        elif arg in ("--outputs-file", "--output", "--require-approval"):
            outputs = rest[index + 1] if arg == "--outputs-file" else outputs
            index += 2
        elif arg.startswith("-"):
            index += 1
        else:
            stack = arg
            index += 1
    with open(os.environ["FAKE_CDK_LOG"], "a") as log:
        log.write(json.dumps({"verb": verb, "context": context, "stack": stack}) + "\n")
    failing = set(filter(None, os.environ.get("FAKE_CDK_FAIL", "").split(",")))
    if f"{verb}:{context.get('falcon.batching')}" in failing or f"{verb}:{stack}" in failing:
        print(f"fake cdk: {verb} {stack} failed", file=sys.stderr)
        return 1
    if verb == "deploy" and outputs:
        with open(outputs, "w") as file:
            json.dump({stack: {"EndpointName": f"{context['env']}-falcon"}}, file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
