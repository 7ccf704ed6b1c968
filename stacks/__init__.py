"""CDK stacks and the settings they are built from."""
