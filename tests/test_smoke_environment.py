"""The smoke environment: the cheapest real version of every part, still passing every check."""

from __future__ import annotations

from settings import load_settings


def test_smoke_settings_are_the_cheap_versions():
    settings = load_settings("smoke")
    assert (settings.training.instance_type, settings.training.epochs, settings.training.max_hours) == (
        "g5.xlarge", 1, 1)
    assert settings.training.max_train_samples and settings.training.max_train_samples <= 5000
    assert (settings.sentiment.instance_type, settings.sentiment.min_instances,
            settings.sentiment.max_instances) == ("ml.c7g.large", 1, 1)
    falcon = settings.falcon
    assert (falcon.model_id, falcon.instance_type, falcon.tensor_parallel_degree) == (
        "tiiuae/falcon-7b", "ml.g5.2xlarge", 1)
    assert settings.network.nat_gateways == 1
    assert settings.network.flow_log_retention_days <= 7 and settings.operations.log_retention_days <= 7


def test_smoke_synthesizes_with_falcon_through_the_sizing_gate_and_cdk_nag(synthesized):
    names = sorted(synthesized("smoke").templates)
    assert names == ["mlrecipes-smoke-artifacts", "mlrecipes-smoke-falcon", "mlrecipes-smoke-network",
                     "mlrecipes-smoke-operations"]
    falcon = synthesized("smoke").template("falcon")
    falcon.has_resource_properties("AWS::SageMaker::EndpointConfig", {
        "ProductionVariants": [{"InstanceType": "ml.g5.2xlarge", "InitialInstanceCount": 1,
                                "VariantName": "AllTraffic", "ModelName": {"Fn::GetAtt": ["Model", "ModelName"]},
                                "ContainerStartupHealthCheckTimeoutInSeconds": 1200,
                                "ModelDataDownloadTimeoutInSeconds": 1200}]})
    # Falcon-7B from the hub on one GPU with vLLM (LMI 0.33): the container registers it from HF_MODEL_ID.
    (model,) = falcon.find_resources("AWS::SageMaker::Model").values()
    environment = model["Properties"]["PrimaryContainer"]["Environment"]
    assert (environment["HF_MODEL_ID"], environment["OPTION_TENSOR_PARALLEL_DEGREE"],
            environment["OPTION_ROLLING_BATCH"]) == ("tiiuae/falcon-7b", "1", "vllm")


def test_everything_e2e_deploys_synthesizes_together(synthesized):
    templates = synthesized("smoke-all")
    assert len(templates.templates) == 6
    [instance] = templates.template("training").find_resources("AWS::EC2::Instance").values()
    assert instance["Properties"]["InstanceType"] == "g5.xlarge"
    user_data = "".join(p if isinstance(p, str) else "" for p in
                        instance["Properties"]["UserData"]["Fn::Base64"]["Fn::Join"][1])
    assert "--num-train-epochs 1 " in user_data and "--max-train-samples 2000" in user_data
    assert "export MAX_HOURS=1\n" in user_data
