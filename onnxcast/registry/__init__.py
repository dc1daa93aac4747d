"""The model registry: MLflow tracking and registration (tracking), the champion/challenger
decision (champion), and fetching an existing model from the registry or S3 (fetch)."""
