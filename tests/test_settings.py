"""Settings: defaults, environments, overrides, and one clear line for every kind of bad input."""

from __future__ import annotations

import dataclasses
import re

import pytest

from settings import SettingsError, known_settings, load_settings, read_context, settings_from_context
from settings.fields import s3_uri_pattern, s3_uri_problem


def test_no_env_means_dev_with_documented_defaults():
    settings = settings_from_context({})
    assert settings.name == "dev"
    assert settings.region == "us-west-2"
    assert settings.account is None
    assert settings.training.enabled is False
    assert settings.training.instance_type == "p4d.24xlarge"
    assert settings.falcon.batching == "rolling_paged"
    assert settings.sentiment.instance_type == "ml.c7g.4xlarge"


@pytest.mark.parametrize("env_name", ["dev", "staging", "prod"])
def test_every_declared_environment_loads(env_name):
    assert load_settings(env_name).name == env_name
    assert env_name in read_context()[0]


def test_environments_differ_where_declared():
    assert load_settings("dev").network.nat_gateways == 1
    assert load_settings("prod").network.nat_gateways == 2


def test_overrides_are_parsed_to_the_setting_type():
    settings = settings_from_context({
        "env": "prod",
        "falcon.instance_type": "ml.g5.24xlarge",
        "falcon.tensor_parallel_degree": "4",
        "training.enabled": "true",
        "training.learning_rate": "2e-5",
        "network.availability_zones": "us-west-2a,us-west-2c",
        "network.endpoints.sts": "off",
        "region": "eu-west-1",
        "account": "123456789012",
    })
    assert settings.name == "prod"
    assert settings.falcon.instance_type == "ml.g5.24xlarge"
    assert settings.falcon.tensor_parallel_degree == 4
    assert settings.training.enabled is True
    assert settings.training.learning_rate == pytest.approx(2e-5)
    assert settings.network.availability_zones == ("us-west-2a", "us-west-2c")
    assert settings.network.endpoints.sts is False
    assert (settings.region, settings.account) == ("eu-west-1", "123456789012")


def test_json_typed_values_from_cdk_json_are_accepted():
    settings = load_settings("dev", {"falcon": {"max_rolling_batch_size": 64, "enabled": False}})
    assert settings.falcon.max_rolling_batch_size == 64


def test_cdk_own_context_keys_are_ignored():
    settings = settings_from_context({"@aws-cdk/core:newStyleStackSynthesis": True,
                                      "aws:cdk:enable-path-metadata": True,
                                      "availability-zones:account=1:region=x": ["a"]})
    assert settings.name == "dev"


def test_settings_are_frozen():
    settings = load_settings("dev")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.region = "eu-west-1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.falcon.enabled = True


def test_every_issue_named_setting_exists():
    names = set(known_settings())
    for name in ["training.enabled", "training.instance_type", "training.run_id", "sentiment.enabled",
                 "sentiment.model_data_url", "sentiment.instance_type", "falcon.enabled", "falcon.model_id",
                 "falcon.instance_type", "falcon.tensor_parallel_degree", "falcon.batching",
                 "falcon.max_rolling_batch_size", "region", "account"]:
        assert name in names


@pytest.mark.parametrize(("context", "key", "fragments"), [
    ({"env": "nope"}, "env", ["'nope'", "dev, staging, prod"]),
    ({"falcon.tensor_parallel_degree": "three"}, "falcon.tensor_parallel_degree", ["'three'", "1, 2, 4, 8"]),
    ({"falcon.instance_typ": "ml.g5.2xlarge"}, "falcon.instance_typ", ["did you mean falcon.instance_type"]),
    ({"falcn.enabled": "true"}, "falcn.enabled", ["did you mean falcon.enabled"]),
    ({"training.enabled": "maybe"}, "training.enabled", ["'maybe'", "true or false"]),
    ({"training.max_hours": "0"}, "training.max_hours", ["'0'", "from 1 to 72"]),
    ({"training.volume_gib": "2.5"}, "training.volume_gib", ["'2.5'", "integer"]),
    ({"falcon.batching": "static"}, "falcon.batching", ["'static'", "dynamic, rolling, rolling_paged"]),
    ({"account": "12345"}, "account", ["'12345'", "12-digit"]),
    ({"region": "mars-1"}, "region", ["'mars-1'", "region name"]),
    ({"network.flow_log_retention_days": "10"}, "network.flow_log_retention_days", ["'10'", "14, 30"]),
    ({"network.availability_zones": "us-west-2a"}, "network.availability_zones", ["two distinct"]),
    ({"sentiment.enabled": "true"}, "sentiment.model_data_url", ["s3://"]),
    ({"sentiment.min_instances": "3", "sentiment.max_instances": "2"}, "sentiment.max_instances", ["min_instances"]),
    ({"sentiment.enabled": "true", "sentiment.model_data_url": "http://x/model.tar.gz"},
     "sentiment.model_data_url", ["s3:// URI"]),
])
def test_bad_input_names_key_value_and_what_is_allowed(context, key, fragments):
    with pytest.raises(SettingsError) as caught:
        settings_from_context(context)
    message = str(caught.value)
    assert caught.value.key == key
    assert "\n" not in message
    assert message.startswith(f"invalid setting {key}=")
    for fragment in fragments:
        assert fragment in message, message


# --- settings retired with sentiment.runtime=dlc (issue 43) --------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "replacement"), [
    ("sentiment.runtime", "dlc", "our serving image is the only sentiment runtime since the TorchServe image of "
                                 "sentiment.runtime=dlc (pytorch-inference-arm64:2.6) ended patching on 2026-06-30"),
    ("sentiment.quantize", "int8", "our server's int8 is sentiment.precision=int8"),
    ("sentiment.pytorch_version", "2.6.0", "the serving image's torch is pinned in "
                                           "inference/sentiment/image/torch.lock"),
])
def test_a_retired_setting_fails_naming_key_value_and_what_replaces_it(key, value, replacement):
    """From `-c`, scoped `-c`, and cdk.json's environment and shared blocks alike: never silently ignored."""
    environments, shared = read_context()
    section, name = key.split(".")
    sources = [
        lambda: settings_from_context({"env": "prod", key: value}),
        lambda: settings_from_context({"env": "prod", f"prod/{key}": value}),
        lambda: load_settings("dev", environments={**environments, "dev": {section: {name: value}}}, shared=shared),
        lambda: load_settings("dev", environments=environments, shared={section: {name: value}}),
    ]
    for source in sources:
        with pytest.raises(SettingsError) as caught:
            source()
        message = str(caught.value)
        assert (caught.value.key, caught.value.value) == (key, value)
        assert message.startswith(f"invalid setting {key}='{value}': expected it removed (retired"), message
        assert replacement in message and "\n" not in message


def test_the_default_value_a_retired_setting_had_is_refused_too():
    """`sentiment.runtime=server` was the default: a cdk.json that spelled it out must drop it as well."""
    with pytest.raises(SettingsError, match=r"invalid setting sentiment.runtime='server': expected it removed"):
        settings_from_context({"sentiment.runtime": "server"})


def test_retired_settings_are_no_settings():
    from settings import RETIRED

    assert set(RETIRED) == {"sentiment.runtime", "sentiment.quantize", "sentiment.pytorch_version"}
    assert not set(RETIRED) & set(known_settings())


def test_bad_value_in_an_environment_declaration_is_reported_too():
    with pytest.raises(SettingsError, match=r"network.nat_gateways=5: expected a value from 1 to 2"):
        load_settings("dev", environments={"dev": {"network": {"nat_gateways": 5}}})


def test_environment_scoped_overrides_apply_to_their_environment_only():
    context = {"falcon.max_rolling_batch_size": "48", "prod/falcon.max_rolling_batch_size": "64",
               "staging/network.nat_gateways": "2"}
    assert settings_from_context({**context, "env": "prod"}).falcon.max_rolling_batch_size == 64
    assert settings_from_context({**context, "env": "dev"}).falcon.max_rolling_batch_size == 48
    assert settings_from_context({**context, "env": "staging"}).network.nat_gateways == 2
    assert settings_from_context({**context, "env": "dev"}).network.nat_gateways == 1


def test_scoped_override_checks_environment_and_setting():
    with pytest.raises(SettingsError, match=r"invalid setting qa/falcon.enabled='true': expected an environment"):
        settings_from_context({"qa/falcon.enabled": "true"})
    with pytest.raises(SettingsError, match=r"invalid setting falcon.tensor_parallel_degree='3'"):
        settings_from_context({"env": "prod", "prod/falcon.tensor_parallel_degree": "3"})


def test_shared_values_apply_to_every_environment_before_its_own():
    environments = {"dev": {}, "prod": {"pipeline": {"branch": "release"}}}
    shared = {"pipeline": {"branch": "trunk", "repository": "acme/ml"}}
    assert load_settings("dev", environments=environments, shared=shared).pipeline.branch == "trunk"
    prod = load_settings("prod", environments=environments, shared=shared).pipeline
    assert (prod.branch, prod.repository) == ("release", "acme/ml")


def test_training_backend_defaults_to_the_ec2_recipe():
    config = settings_from_context({}).training
    assert (config.backend, config.instance_count, config.spot) == ("ec2", 1, False)


def test_sagemaker_backend_settings_and_derived_values():
    config = settings_from_context({"training.backend": "sagemaker", "training.instance_count": "2",
                                    "training.spot": "true", "training.max_hours": "5"}).training
    assert config.sagemaker_instance_type == "ml.p4d.24xlarge"
    assert config.spot_wait_hours == 10
    assert settings_from_context({"training.backend": "sagemaker", "training.max_hours": "50"}
                                 ).training.spot_wait_hours == 72


@pytest.mark.parametrize(("overrides", "message"), [
    ({"training.backend": "batch"}, "invalid setting training.backend='batch': expected one of ec2, sagemaker"),
    ({"training.instance_count": "2"}, "training.instance_count=2: expected 1 with training.backend=ec2"),
    ({"training.spot": "true"}, "training.spot=true: expected false with training.backend=ec2"),
    ({"training.backend": "sagemaker", "training.spot_max_wait_hours": "2"},
     "training.spot_max_wait_hours=2: expected at least training.max_hours (6)"),
    ({"training.backend": "sagemaker", "training.sagemaker_image_tag": "2.13.0-cu133-amzn2023"},
     "invalid setting training.sagemaker_image_tag='2.13.0-cu133-amzn2023': expected one of "
     "2.14-cu133-amzn2023-sagemaker, 2.13-cu133-amzn2023-sagemaker, 2.12-cu130-amzn2023-sagemaker, "
     "2.11-cu130-amzn2023-sagemaker"),
    ({"training.base_image_tag": "2.10.0-gpu-py313-cu130-ubuntu22.04-ec2"},
     "invalid setting training.base_image_tag='2.10.0-gpu-py313-cu130-ubuntu22.04-ec2': expected one of "
     "2.14.0-cu133-amzn2023, 2.13.0-cu133-amzn2023, 2.12.1-cu130-amzn2023, 2.11.0-cu130-amzn2023"),
    ({"training.min_macro_recall": "1.5"}, "training.min_macro_recall='1.5': expected a value from 0 to 1"),
])
def test_sagemaker_backend_refuses_inconsistent_settings(overrides, message):
    with pytest.raises(SettingsError) as error:
        settings_from_context(overrides)
    assert message in str(error.value)


@pytest.mark.parametrize(("key", "value", "problem"), [
    # Issue 45: the pattern alone said only what is allowed.
    ("sentiment.model_data_url", "s3://b/m/model.tar.gz",
     "its bucket name 'b' is 1 character long; S3 bucket names are 3 to 63 characters"),
    ("sentiment.model_data_url", "https://bucket/m/model.tar.gz", "it does not start with s3://"),
    ("sentiment.model_data_url", "s3://My_Bucket/m/model.tar.gz",
     "its bucket name 'My_Bucket' holds 'B', 'M', '_'; S3 bucket names hold only lowercase letters, digits, '.' "
     "and '-'"),
    ("sentiment.model_data_url", "s3://bucket-/m/model.tar.gz",
     "its bucket name 'bucket-' must begin and end with a lowercase letter or a digit"),
    ("sentiment.model_data_url", "s3://bucket", "it names no object key after the bucket"),
    ("sentiment.model_data_url", "s3://bucket/m/model.zip", "its object key 'm/model.zip' does not end in .tar.gz"),
    ("falcon.model_s3_uri", "s3://" + "b" * 64 + "/weights/",
     f"its bucket name '{'b' * 64}' is 64 characters long; S3 bucket names are 3 to 63 characters"),
    ("falcon.model_s3_uri", "s3://bucket/weights", "its object key 'weights' does not end in /"),
])
def test_a_refused_s3_location_says_what_is_wrong_with_it(key, value, problem):
    words = {"sentiment.model_data_url": "an s3:// URI of a model.tar.gz",
             "falcon.model_s3_uri": "an s3:// prefix ending in /"}[key]
    with pytest.raises(SettingsError) as error:
        load_settings("dev", {key: value})
    assert str(error.value) == f"invalid setting {key}={value!r}: expected {words} ({problem})"


@pytest.mark.parametrize("ending", [".tar.gz", "/"])
def test_the_s3_location_words_and_pattern_accept_the_same_values(ending):
    """The pattern goes into cdk.json's JSON Schema; the words into errors: neither may accept what the other
    refuses."""
    keys = ["model.tar.gz", "runs/r1/model.tar.gz", "weights/", "a/", "/", ".tar.gz", "x.tar.gz", "", "w"]
    buckets = ["b", "ab", "abc", "my-bucket", "my.bucket.1", "a" * 63, "a" * 64, "-ab", "ab-", "aB1", "a_b", "1ab"]
    for bucket in buckets:
        for key in keys:
            for value in (f"s3://{bucket}/{key}", f"s3://{bucket}", f"S3://{bucket}/{key}"):
                matches = re.fullmatch(s3_uri_pattern(ending), value) is not None
                assert matches == (s3_uri_problem(value, ending) is None), value
