"""Lambda functions: each folder is one function's deployment package (plain Python + Powertools layer)."""
