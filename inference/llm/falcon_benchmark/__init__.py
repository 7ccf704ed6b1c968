"""The Falcon recipe's batching comparison as one command: deploy each mode, load-test it, tear down, compare.

    python -m inference.llm.falcon_benchmark --env dev --modes dynamic,rolling_paged --shapes 32x128,256x32

Files: `recipe` (the published figures and the load steps), `aws` (the CDK CLI and the few AWS calls),
`costs` (prices and the estimate), `run` (the orchestration and its teardown), `compare` (the table and
picture beside the recipe's figures), `cli` (arguments and exit status).
"""
