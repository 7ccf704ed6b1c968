"""Deep Learning Container image URIs, computed offline from a region table (no SDK call at synth)."""

from __future__ import annotations

# Registry account of the AWS Deep Learning Containers, by region.
_DEFAULT_ACCOUNT = "763104351884"
_DEFAULT_REGIONS = (
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "ap-south-1", "ap-northeast-1", "ap-northeast-2",
    "ap-southeast-1", "ap-southeast-2", "ca-central-1", "eu-central-1", "eu-west-1", "eu-west-2", "eu-west-3",
    "eu-north-1", "sa-east-1",
)
DLC_ACCOUNTS: dict[str, str] = {
    **dict.fromkeys(_DEFAULT_REGIONS, _DEFAULT_ACCOUNT),
    "af-south-1": "626614931356",
    "ap-east-1": "871362719292",
    "ap-south-2": "772153158452",
    "ap-southeast-3": "907027046896",
    "ap-southeast-4": "457447274322",
    "ap-southeast-5": "550225433462",
    "ap-southeast-6": "633930458069",
    "ap-east-2": "975050140332",
    "ap-southeast-7": "590183813437",
    "mx-central-1": "637423239942",
    "ap-northeast-3": "364406365360",
    "ca-west-1": "204538143572",
    "eu-central-2": "380420809688",
    "eu-south-1": "692866216735",
    "eu-south-2": "503227376785",
    "il-central-1": "780543022126",
    "me-south-1": "217643126080",
    "me-central-1": "914824155844",
    "cn-north-1": "727897471807",
    "cn-northwest-1": "727897471807",
    "us-gov-east-1": "446045086412",
    "us-gov-west-1": "442386744353",
}


class UnsupportedRegionError(ValueError):
    def __init__(self, region: str) -> None:
        super().__init__(f"no Deep Learning Containers registry is known for region {region!r}; "
                         f"known regions: {', '.join(sorted(DLC_ACCOUNTS))}")
        self.region = region


def dlc_account(region: str) -> str:
    try:
        return DLC_ACCOUNTS[region]
    except KeyError:
        raise UnsupportedRegionError(region) from None


def dlc_registry(region: str) -> str:
    """The registry host to `docker login` to: `<account>.dkr.ecr.<region>.<domain>`."""
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{dlc_account(region)}.dkr.ecr.{region}.{domain}"


def dlc_image_uri(region: str, repository: str, tag: str) -> str:
    return f"{dlc_registry(region)}/{repository}:{tag}"


def dlc_repository_arn(region: str, repository: str) -> str:
    partition = "aws-cn" if region.startswith("cn-") else "aws-us-gov" if region.startswith("us-gov-") else "aws"
    return f"arn:{partition}:ecr:{region}:{dlc_account(region)}:repository/{repository}"
