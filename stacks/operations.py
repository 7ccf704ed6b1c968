"""Operating an environment: model registration, the training watchdog, alarms and a dashboard."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from settings import REPO_ROOT, Settings
from stacks.artifacts import ArtifactsStack
from stacks.base import EnvironmentStack, log_retention
from stacks.nag import GLUE_LAMBDA, acknowledge, acknowledge_each
from stacks.powertools import layer_directory
from stacks.sentiment import serving_image_uri

LAMBDA_RUNTIME = lambda_.Runtime.PYTHON_3_14
METRICS_NAMESPACE = "MlRecipes"
MODEL_PREFIX = "models/sentiment/"


class OperationsStack(EnvironmentStack):
    def __init__(self, scope: Construct, *, settings: Settings, artifacts: ArtifactsStack) -> None:
        super().__init__(scope, "operations", settings=settings,
                         description="Model registration, training watchdog, alarms and dashboard")
        self.settings = settings
        self.artifacts = artifacts
        self.add_stack_dependency(artifacts, "imports the artifact bucket ARN by export name")
        config = settings.operations
        topic = artifacts.alarm_topic
        if config.alarm_email:
            email = topic.add_subscription(subscriptions.EmailSubscription(config.alarm_email))
            acknowledge(email, "Serverless-SNSRedrivePolicy",
                        "SNS retries e-mail delivery and the alarm's state stays in CloudWatch; a queue of undelivered "
                        "e-mails would need its own watcher")

        self.dead_letters = sqs.Queue(
            self, "DeadLetters", encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
            retention_period=cdk.Duration.days(14))
        acknowledge(self.dead_letters, "Serverless-SQSRedrivePolicy", "it is itself the dead-letter queue")
        # Built from the pinned package (stacks/powertools.py), not the public layer's SSM parameter.
        powertools = lambda_.LayerVersion(
            self, "Powertools",
            code=lambda_.Code.from_asset(str(layer_directory(config.powertools_version))),
            compatible_runtimes=[LAMBDA_RUNTIME],
            description=f"Powertools for AWS Lambda (Python) {config.powertools_version}, jmespath, typing_extensions")

        self.model_package_group = sagemaker.CfnModelPackageGroup(
            self, "SentimentModels", model_package_group_name=f"{settings.stack_prefix}-sentiment",
            model_package_group_description="Sentiment models trained by the training stack, pending approval")
        self.register_model = self._function("RegisterModel", "register_model", powertools, environment={
            "MODEL_PACKAGE_GROUP": self.model_package_group.model_package_group_name,
            # Our serving image as the sentiment stack of this code tags it (its content hash), known at synth
            # without building it here: the operations stack is deployed first and needs no Docker. A package
            # registered before that image is published names a tag that the sentiment stack's deploy pushes.
            "INFERENCE_IMAGE": serving_image_uri(self),
            "INFERENCE_INSTANCE_TYPE": settings.sentiment.instance_type,
            "TOPIC_ARN": topic.topic_arn,
        }, description="Registers a finished training run as a model package pending approval")
        self.watchdog = self._function("TrainingWatchdog", "training_watchdog", powertools, environment={
            "PROJECT": settings.project,
            "ENVIRONMENT": settings.name,
            "DEFAULT_MAX_HOURS": str(settings.training.max_hours),
            "TOPIC_ARN": topic.topic_arn,
        }, description="Terminates this environment's training instances that run past their max hours")
        self._triggers(artifacts)
        self._grant()
        self._alarms(topic)
        self.dashboard = self._dashboard()

        cdk.CfnOutput(self, "ModelPackageGroupName", value=self.model_package_group.model_package_group_name,
                      description="Registered sentiment models (approve one to deploy it)")
        cdk.CfnOutput(self, "DashboardName", value=self.dashboard.dashboard_name, description="CloudWatch dashboard")
        cdk.CfnOutput(self, "DeadLetterQueueUrl", value=self.dead_letters.queue_url,
                      description="Events the functions could not handle")

    def _function(self, construct_id: str, folder: str, powertools: lambda_.ILayerVersion, *,
                  environment: dict[str, str], description: str) -> lambda_.Function:
        log_group = logs.LogGroup(self, f"{construct_id}Logs", encryption_key=self.artifacts.key,
                                  retention=log_retention(self.settings.operations.log_retention_days),
                                  removal_policy=cdk.RemovalPolicy.DESTROY)
        role = iam.Role(self, f"{construct_id}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                        description=description)
        role.add_to_policy(iam.PolicyStatement(sid="WriteLogs", actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                                               resources=[log_group.log_group_arn]))
        function = lambda_.Function(
            self, construct_id,
            description=description,
            runtime=LAMBDA_RUNTIME,
            handler="handler.handler",
            code=lambda_.Code.from_asset(str(REPO_ROOT / "lambdas" / folder), exclude=["__pycache__"]),
            layers=[powertools],
            role=role,
            log_group=log_group,
            timeout=cdk.Duration.seconds(60),
            memory_size=256,
            # No reserved concurrency: Lambda refuses a reservation that leaves an account fewer than its
            # minimum of unreserved executions (100 with the default quota, "reserve up to the Unreserved account
            # concurrency value ... minus 100"; lower on low-quota accounts, whose whole quota may be that minimum):
            # https://docs.aws.amazon.com/lambda/latest/dg/configuration-concurrency.html. The schedule and the
            # S3 markers invoke these functions a few times an hour.
            tracing=lambda_.Tracing.ACTIVE,
            dead_letter_queue=self.dead_letters,
            retry_attempts=2,
            environment={**environment, "METRICS_NAMESPACE": METRICS_NAMESPACE,
                         "POWERTOOLS_SERVICE_NAME": folder.replace("_", "-"), "POWERTOOLS_LOG_LEVEL": "INFO"},
        )
        acknowledge_each(function, GLUE_LAMBDA)
        acknowledge(function, "Serverless-LambdaAsyncFailureDestination",
                    "failed asynchronous invocations go to the dead-letter queue (DeadLetterConfig) already")
        return function

    def _triggers(self, artifacts: ArtifactsStack) -> None:
        """S3 'Object Created' for a run's _SUCCESS marker -> register; a schedule -> watchdog."""
        success = events.Rule(self, "RunSucceeded", description="A training run wrote its _SUCCESS marker",
                              event_pattern=events.EventPattern(
                                  source=["aws.s3"], detail_type=["Object Created"],
                                  detail={"bucket": {"name": [artifacts.bucket.bucket_name]},
                                          "object": {"key": [{"wildcard": f"{MODEL_PREFIX}*/_SUCCESS"}]}}))
        schedule = events.Rule(self, "WatchdogSchedule", description="Look for overdue training instances",
                               schedule=events.Schedule.rate(
                                   cdk.Duration.minutes(self.settings.operations.watchdog_minutes)))
        for rule, function in ((success, self.register_model), (schedule, self.watchdog)):
            rule.add_target(targets.LambdaFunction(function, dead_letter_queue=self.dead_letters, retry_attempts=4,
                                                   max_event_age=cdk.Duration.hours(2)))

    def _grant(self) -> None:
        """Each function's permissions, narrowed to this environment's bucket prefix, group, topic and tags."""
        topic, key = self.artifacts.alarm_topic, self.artifacts.key
        group_name = self.model_package_group.model_package_group_name
        register, watchdog = self.register_model.role, self.watchdog.role
        register.add_to_principal_policy(iam.PolicyStatement(
            sid="ReadRuns", actions=["s3:GetObject"], resources=[self.artifacts.objects_arn(MODEL_PREFIX)]))
        register.add_to_principal_policy(iam.PolicyStatement(
            sid="DecryptRuns", actions=["kms:Decrypt"], resources=[key.key_arn],
            conditions={"StringEquals": {"kms:ViaService": f"s3.{self.region}.amazonaws.com"}}))
        register.add_to_principal_policy(iam.PolicyStatement(
            sid="RegisterModel", actions=["sagemaker:CreateModelPackage"],
            resources=[f"arn:{self.partition}:sagemaker:{self.region}:{self.account}:model-package-group/{group_name}",
                       f"arn:{self.partition}:sagemaker:{self.region}:{self.account}:model-package/{group_name}/*"]))
        watchdog.add_to_principal_policy(iam.PolicyStatement(
            sid="FindInstances", actions=["ec2:DescribeInstances"], resources=["*"]))
        watchdog.add_to_principal_policy(iam.PolicyStatement(
            sid="TerminateOurTrainingInstances", actions=["ec2:TerminateInstances"],
            resources=[f"arn:{self.partition}:ec2:{self.region}:{self.account}:instance/*"],
            conditions={"StringEquals": {"aws:ResourceTag/project": self.settings.project,
                                         "aws:ResourceTag/environment": self.settings.name,
                                         "aws:ResourceTag/component": "training"}}))
        for role in (register, watchdog):
            # topic.grant_publish would add kms:GenerateDataKey* on the key; these two actions are all SNS needs.
            role.add_to_principal_policy(iam.PolicyStatement(
                sid="Notify", actions=["sns:Publish"], resources=[topic.topic_arn]))
            role.add_to_principal_policy(iam.PolicyStatement(
                sid="EncryptNotifications", actions=["kms:GenerateDataKey", "kms:Decrypt"], resources=[key.key_arn],
                conditions={"StringEquals": {"kms:ViaService": f"sns.{self.region}.amazonaws.com"}}))
        acknowledge(register, self.artifacts.objects_finding(MODEL_PREFIX),
                    "Any run's files under models/sentiment/ may be the one whose marker just landed.")
        acknowledge(register, self._finding(f"model-package/{group_name}/*"),
                    "Model package versions are numbered by SageMaker inside this one group.")
        acknowledge(watchdog, "IAM5[Resource::*]",
                    "ec2:DescribeInstances and the X-Ray actions of active tracing have no resource-level scope.")
        acknowledge(register, "IAM5[Resource::*]",
                    "xray:PutTraceSegments and xray:PutTelemetryRecords (active tracing) have no resource-level scope.")
        acknowledge(watchdog, self._finding("instance/*", service="ec2"),
                    "TerminateInstances is limited by condition to instances tagged with this project, environment "
                    "and component=training.")

    def _finding(self, resource: str, service: str = "sagemaker") -> str:
        partition = "<AWS::Partition>" if cdk.Token.is_unresolved(self.partition) else self.partition
        account = "<AWS::AccountId>" if cdk.Token.is_unresolved(self.account) else self.account
        return f"IAM5[Resource::arn:{partition}:{service}:{self.region}:{account}:{resource}]"

    def _alarms(self, topic: sns.ITopic) -> None:
        action = cw_actions.SnsAction(topic)
        for name, function in (("RegisterModel", self.register_model), ("TrainingWatchdog", self.watchdog)):
            alarm = function.metric_errors(period=cdk.Duration.minutes(5)).create_alarm(
                self, f"{name}Errors", threshold=1, evaluation_periods=1,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                alarm_description=f"{self.settings.stack_prefix}: {name} failed")
            alarm.add_alarm_action(action)
        dead = self.dead_letters.metric_approximate_number_of_messages_visible(
            period=cdk.Duration.minutes(5)).create_alarm(
            self, "DeadLettersWaiting", threshold=1, evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"{self.settings.stack_prefix}: events wait in the dead-letter queue")
        dead.add_alarm_action(action)

    def _dashboard(self) -> cloudwatch.Dashboard:
        settings = self.settings
        dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"{settings.stack_prefix}-operations")
        dashboard.add_widgets(cloudwatch.TextWidget(
            markdown=f"# {settings.project} / {settings.name}\nEndpoints, training runs and glue functions.",
            width=24, height=2))
        if settings.sentiment.enabled:
            dashboard.add_widgets(*endpoint_widgets(f"{settings.name}-sentiment", gpu=False))
        if settings.falcon.enabled:
            dashboard.add_widgets(*endpoint_widgets(f"{settings.name}-falcon", gpu=True))

        def runs(metric_name: str, service: str) -> cloudwatch.Metric:
            return cloudwatch.Metric(namespace=METRICS_NAMESPACE, metric_name=metric_name,
                                     dimensions_map={"service": service}, statistic="Sum",
                                     period=cdk.Duration.hours(1))

        dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Training runs", width=12, left=[
                runs("RunsRegistered", "register-model"), runs("RunsRejected", "register-model"),
                runs("InstancesTerminated", "training-watchdog")]),
            cloudwatch.GraphWidget(title="Glue functions: invocations and errors", width=12, left=[
                self.register_model.metric_invocations(), self.register_model.metric_errors(),
                self.watchdog.metric_invocations(), self.watchdog.metric_errors(),
                self.dead_letters.metric_approximate_number_of_messages_visible()]),
        )
        return dashboard


def endpoint_widgets(endpoint_name: str, *, gpu: bool) -> list[cloudwatch.IWidget]:
    """Invocations, errors, latency percentiles, instance count and utilization of one endpoint."""
    variant = {"EndpointName": endpoint_name, "VariantName": "AllTraffic"}

    def metric(name: str, statistic: str = "Sum", namespace: str = "AWS/SageMaker", label: str | None = None):
        return cloudwatch.Metric(namespace=namespace, metric_name=name, dimensions_map=variant, statistic=statistic,
                                 period=cdk.Duration.minutes(1), label=label)

    instances = cloudwatch.MathExpression(
        expression="invocations / IF(perInstance > 0, perInstance, 1)", label="instances (serving)",
        using_metrics={"invocations": metric("Invocations"), "perInstance": metric("InvocationsPerInstance")},
        period=cdk.Duration.minutes(1))
    utilization = [metric("CPUUtilization", "Average", "/aws/sagemaker/Endpoints")]
    if gpu:
        utilization += [metric("GPUUtilization", "Average", "/aws/sagemaker/Endpoints"),
                        metric("GPUMemoryUtilization", "Average", "/aws/sagemaker/Endpoints")]
    return [
        cloudwatch.GraphWidget(title=f"{endpoint_name}: invocations and errors", width=8, left=[
            metric("Invocations"), metric("Invocation4XXErrors"), metric("Invocation5XXErrors")]),
        cloudwatch.GraphWidget(title=f"{endpoint_name}: model latency (microseconds)", width=8, left=[
            metric("ModelLatency", "p50", label="p50"), metric("ModelLatency", "p90", label="p90")]),
        cloudwatch.GraphWidget(title=f"{endpoint_name}: instances and utilization (%)", width=8,
                               left=[instances], right=utilization),
    ]
