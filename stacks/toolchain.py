"""The npm tools our deployments run, each pinned once: package.json's devDependencies, exact versions.

- `aws-cdk`, the CDK CLI: every workstation command (`npx cdk` after `npm ci`, which `make install` runs), the
  pipeline's synth step (the same `make install-infra` and `npx cdk`) and its self-mutation
  (`CodePipeline(cli_version=...)`, whose project runs `npm install -g aws-cdk@<version>`).
- `cdk-assets`: what CDK Pipelines' asset publishing projects run (`CodePipeline(cdk_assets_cli_version=...)`:
  `npm install -g cdk-assets@<version>`, then `cdk-assets --path <manifest> --verbose publish <asset:destination>`).
  It must read the cloud assembly schema the pinned aws-cdk-lib writes; tests/test_pipeline_publishing.py runs the
  node_modules copy on the pipeline's asset manifests.

package-lock.json holds the same versions with their integrity hashes (`npm ci` refuses a lock that disagrees with
package.json). How to move a pin: docs/operations.md, "Tool versions".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE_JSON = REPO_ROOT / "package.json"
CDK_CLI = "aws-cdk"
CDK_ASSETS = "cdk-assets"
# An exact release: a range or a dist-tag (`latest`) would let npm choose on the day of each run.
EXACT_VERSION = re.compile(r"\d+\.\d+\.\d+")


class ToolchainError(ValueError):
    """package.json does not pin a tool exactly; the message names the key, the value and what is allowed."""


def pinned(package: str, package_json: Path = PACKAGE_JSON) -> str:
    """The exact version package.json's devDependencies pin for `package`."""
    key = f"devDependencies.{package}"
    dependencies = json.loads(package_json.read_text()).get("devDependencies") or {}
    if package not in dependencies:
        raise ToolchainError(f"{package_json.name}: {key} is missing: expected an exact version such as 1.2.3 "
                             f"(npm install --save-dev --save-exact {package}@<version>)")
    version = dependencies[package]
    if not isinstance(version, str) or not EXACT_VERSION.fullmatch(version):
        raise ToolchainError(f"{package_json.name}: {key}={json.dumps(version)}: expected an exact version such "
                             "as 1.2.3, not a range or a tag (the pipeline installs it with npm install -g)")
    return version


def cdk_cli_version() -> str:
    """The CDK CLI of workstations, the pipeline's synth and its self-mutation."""
    return pinned(CDK_CLI)


def cdk_assets_version() -> str:
    """The cdk-assets release the pipeline's asset publishing projects install and run."""
    return pinned(CDK_ASSETS)
